"""The `%%gpu_offload` magic, its engine, the runner and the backends."""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpu_offload.magics``: register ``%%gpu_offload``, ``%gpu_offload`` and ``%gpu_result``."""
    from .magic import GpuOffloadMagics

    ipython.register_magics(GpuOffloadMagics(ipython))
