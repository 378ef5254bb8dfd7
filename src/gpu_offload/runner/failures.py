"""How the runner reports a failed run: an ``error`` frame, then :class:`CellFailed` to unwind."""

from __future__ import annotations

from collections.abc import Callable

Emit = Callable[..., None]


class CellFailed(Exception):
    """The run failed and its ``error`` frame has been sent."""


def fail(emit: Emit, ename: str, evalue: str, tb: list[str] | None = None) -> CellFailed:
    """Send an ``error`` frame; return the exception for the caller to raise."""
    emit("error", ename=ename, evalue=evalue, traceback=tb or [f"{ename}: {evalue}\n"])
    return CellFailed(f"{ename}: {evalue}")
