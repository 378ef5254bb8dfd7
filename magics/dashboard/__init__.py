"""The notebook panel: clusters, GPUs and my offloaded runs, live (``%gpu_offload panel`` or
``gpu_offload.magics.panel()``).

``records`` holds the run records and the shared state directory, ``tracking`` records runs at the
engine's event boundary, ``runs`` and ``clusters`` read what the panel shows, ``plot`` draws the GPU
sparkline, ``widget`` is the ipywidgets panel and ``sources`` wires them to this kernel's magic.
"""

from __future__ import annotations

from typing import Any


def panel(shell: Any = None, interval: float = 2.0) -> Any:
    """Show the panel under the current cell and return it (``.close()`` stops its updates)."""
    from .sources import open_panel

    return open_panel(shell, interval)
