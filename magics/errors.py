"""Exceptions of the ``%%gpu_offload`` magic. Each message names the object, the cause and the next step."""

from __future__ import annotations

from collections.abc import Sequence

from IPython.core.error import UsageError


class OffloadError(Exception):
    """Base class of every error the magic raises on purpose."""


class OffloadUsageError(OffloadError, UsageError):
    """Bad magic arguments or a cell that cannot be offloaded; nothing was launched.

    It is an IPython ``UsageError``, so IPython prints the message without a traceback.
    """


class InputNotSerializable(OffloadError):
    """A variable the cell reads cannot be pickled; nothing was launched."""

    def __init__(self, name: str, type_name: str, cause: str) -> None:
        self.name = name
        self.type_name = type_name
        super().__init__(
            f"Input `{name}` (type {type_name}) cannot be sent to the runner: {cause}. Nothing was "
            f"launched and your variables are untouched. Create `{name}` inside the offloaded cell, "
            "or stop reading it there."
        )


class RemoteError(OffloadError):
    """The offloaded cell raised. IPython shows the remote traceback (``_render_traceback_``)."""

    def __init__(self, ename: str, evalue: str, traceback: Sequence[str]) -> None:
        self.ename = ename
        self.evalue = evalue
        self.traceback = list(traceback)
        super().__init__(f"{ename}: {evalue}")

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting our local frames, which would only show the engine.
        note = "(raised on the runner; output printed before the error is kept, no variable was copied back)"
        return [*self.traceback, f"RemoteError: {self.ename}: {self.evalue} {note}"]


class RunnerDied(OffloadError):
    """The runner process ended before finishing the cell."""

    def __init__(self, exit_code: int | None, detail: str = "") -> None:
        self.exit_code = exit_code
        self.detail = detail
        if exit_code is not None and exit_code < 0:
            cause = f"killed by signal {-exit_code} (exit code {exit_code})"
        else:
            cause = f"exit code {exit_code}"
        message = (
            f"The runner ended before finishing the cell: {cause}. Output so far is kept; no variable "
            "was copied back. If the cell called os._exit or ran out of memory, fix that and run it again."
        )
        if detail:
            message += f"\nLast runner diagnostics:\n{detail}"
        super().__init__(message)


class OffloadTimeout(OffloadError):
    """The cell ran longer than ``--timeout`` and was interrupted."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(
            f"The offloaded cell ran longer than --timeout {seconds:g} s and was interrupted; output so "
            "far is kept, no variable was copied back. Raise --timeout or make the cell faster."
        )


class OffloadQueueTimeout(OffloadError):
    """The run waited in the queue longer than ``--queue-timeout`` and was withdrawn before it started."""

    def __init__(self, seconds: float, last: str = "") -> None:
        self.seconds = seconds
        where = f" (last seen: {last})" if last else ""
        super().__init__(
            f"Gave up after waiting --queue-timeout {seconds:g} s in the queue{where}: the run was withdrawn "
            "before it started, so nothing ran and no variable was copied back. Run the cell again later, ask "
            "for fewer GPUs, or raise --queue-timeout (leave it out to wait as long as it takes)."
        )


class BackendNotConfigured(OffloadUsageError):
    """A backend was asked for that this kernel cannot use (shown as a ``UsageError``)."""
