"""A matplotlib backend (``MPLBACKEND=module://<runner>.mpl_backend``): Agg rendering, ``show()`` displays.

Selected through the environment before the cell runs, so ``plt.show()`` sends PNGs under the cell
instead of warning that Agg cannot show; matplotlib imports this module only when pyplot is used.
"""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg

from .display import show_open_figures

FigureCanvas = FigureCanvasAgg


def show(*args: Any, **kwargs: Any) -> None:
    """Display all open figures as PNG and close them."""
    show_open_figures()
