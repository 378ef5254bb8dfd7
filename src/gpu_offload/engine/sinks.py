"""Where a run's events go: the notebook (live), or a recording replayed later (``--noblock``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Protocol

from ..runner.frames import Metrics

PREFIX = "gpu_offload: "
_NOTES_SHOWN: set[str] = set()


class Progress(str):
    """A notice that says how a wait goes (a place in line, no output yet): the notebook shows the newest one
    in place of the one before, where other notices add a line. A plain ``str`` to every other sink."""


class Sink(Protocol):
    """Receives what a run shows the user."""

    def stream(self, name: str, text: str) -> None:
        """Text the cell wrote to ``stdout`` or ``stderr``."""
        ...

    def display(self, data: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        """A rich output (MIME bundle)."""
        ...

    def notice(self, text: str) -> None:
        """A message of ours (progress, warnings), not the cell's."""
        ...

    def metrics(self, metrics: Metrics) -> None:
        """A GPU metrics sample (or the no-GPU note)."""
        ...


class NotebookSink:
    """Writes into the running cell: stdout/stderr flushed per write, so ipykernel publishes at once.

    Notices are ours, not the cell's: they go in one quiet display output under the cell (plain text, which
    JupyterLab does not paint red as it does stderr), updated in place, so the cell's stderr stays its own.
    """

    def __init__(self) -> None:
        self._cell: object = None
        self._handle: Any = None
        self._lines: list[str] = []
        self._progress = ""

    def stream(self, name: str, text: str) -> None:
        """Write to the kernel's own stream and flush (ipykernel otherwise batches for 0.2 s)."""
        target = sys.stderr if name == "stderr" else sys.stdout
        target.write(text)
        target.flush()

    def display(self, data: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        """Publish a ``display_data`` message (a plain shell prints the text form)."""
        from IPython.display import publish_display_data

        publish_display_data(dict(data), dict(metadata))

    def notice(self, text: str) -> None:
        """Show a notice of ours in the cell's notice output (created at the cell's first notice)."""
        from IPython.display import display

        cell = _current_cell()
        if cell != self._cell or self._handle is None:
            self._cell, self._handle, self._lines, self._progress = cell, None, [], ""
        if isinstance(text, Progress):
            self._progress = text
        else:
            self._lines.append(text)
        shown = [*self._lines, *([self._progress] if self._progress else [])]
        bundle = {"text/plain": "\n".join(PREFIX + line for line in shown)}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def metrics(self, metrics: Metrics) -> None:
        """Show the no-GPU note once per kernel; samples are kept for ``%gpu_offload status``."""
        if metrics.note and metrics.note not in _NOTES_SHOWN:
            _NOTES_SHOWN.add(metrics.note)
            self.notice(metrics.note)


def _current_cell() -> object:
    """What tells one cell from the next: the shell's execution count (None outside IPython)."""
    from IPython import get_ipython

    shell = get_ipython()
    return None if shell is None else shell.execution_count


class RecordingSink:
    """Keeps events for a ``--noblock`` run until its handle shows them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def stream(self, name: str, text: str) -> None:
        """Record stream text."""
        self.calls.append(("stream", (name, text)))

    def display(self, data: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        """Record a rich output."""
        self.calls.append(("display", (data, metadata)))

    def notice(self, text: str) -> None:
        """Record a notice."""
        self.calls.append(("notice", (text,)))

    def metrics(self, metrics: Metrics) -> None:
        """Record metrics."""
        self.calls.append(("metrics", (metrics,)))

    def replay(self, sink: Sink) -> None:
        """Send everything recorded so far to ``sink``, once."""
        calls, self.calls = self.calls, []
        for method, args in calls:
            getattr(sink, method)(*args)
