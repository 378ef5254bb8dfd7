"""Exceptions of the ``%%gpu_offload`` magic. Each message names the object, the cause and the next step."""

from __future__ import annotations

from collections.abc import Sequence

from IPython.core.error import UsageError


class OffloadError(Exception):
    """Base class of every error the magic raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this list instead of the traceback. The magic's own frames say nothing about the
        # user's cell, and IPython drops them only for its exact UsageError class, not for subclasses.
        return [f"{type(self).__name__}: {self}"]


class OffloadUsageError(OffloadError, UsageError):
    """Bad magic arguments or a cell that cannot be offloaded; nothing was launched.

    It is an IPython ``UsageError``, so IPython prints the message without a traceback.
    """


class CellSyntaxError(OffloadUsageError):
    """The cell is not valid Python; shown as Python shows a syntax error: the line, a caret, the message."""

    def __init__(self, line: int, text: str, column: int, end_column: int, message: str) -> None:
        self.line = line
        """Line in the notebook cell (the magic's line is line 1)."""
        self.text = text
        self.column = column
        """1-based column of the first offending character (0 when unknown)."""
        self.end_column = end_column
        self.where = "Cell"
        """How the traceback names the cell (the magic adds IPython's ``In[N]``)."""
        super().__init__(f"Syntax error on line {line} of the cell: {message}. Nothing was launched; fix the "
                         "line and run the cell again.")

    def _render_traceback_(self) -> list[str]:
        shown = self.text.rstrip("\r\n").expandtabs(1)
        stripped = shown.lstrip()
        indent = len(shown) - len(stripped)
        lines = [f"  {self.where}, line {self.line}", f"    {stripped}"]
        if self.column > 0:
            width = self.end_column - self.column if self.end_column > self.column else 1
            start = max(0, self.column - 1 - indent)
            lines.append("    " + " " * start + "^" * max(1, min(width, len(stripped) - start)))
        return [*lines, f"SyntaxError: {self}"]


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
