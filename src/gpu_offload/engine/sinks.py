"""Where a run's events go: the notebook (live), or a recording replayed later (``--noblock``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Protocol

from ..runner.frames import Metrics

PREFIX = "gpu_offload: "
_NOTES_SHOWN: set[str] = set()


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
    """Writes into the running cell: stdout/stderr flushed per write, so ipykernel publishes at once."""

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
        """Our own messages go to stderr, so they never mix with the cell's stdout."""
        self.stream("stderr", f"{PREFIX}{text}\n")

    def metrics(self, metrics: Metrics) -> None:
        """Show the no-GPU note once per kernel; samples are kept for ``%gpu_offload status``."""
        if metrics.note and metrics.note not in _NOTES_SHOWN:
            _NOTES_SHOWN.add(metrics.note)
            self.notice(metrics.note)


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
