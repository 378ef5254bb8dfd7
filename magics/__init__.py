"""The `%%gpu_offload` magic and its panel: a front end over :mod:`gpu_offload.engine`."""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpu_offload.magics``: register ``%%gpu_offload``, ``%gpu_offload`` and ``%gpu_result``."""
    from .magic import GpuOffloadMagics

    ipython.register_magics(GpuOffloadMagics(ipython))


def panel(interval: float = 2.0) -> Any:
    """Show the live panel of clusters and my runs under the current cell (same as ``%gpu_offload panel``).

    Returns the panel; ``.close()`` stops its background updates.
    """
    from .dashboard import panel as open_panel

    return open_panel(None, interval)
