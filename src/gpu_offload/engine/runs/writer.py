"""The run book's writes, off the cell's path: changed records are written in batches by one thread.

Writing a record is a create and a rename in the state directory (and, for a finished run, the removal of a
cancel request and now and then a prune): about half a millisecond of a warm cell's CPU on a journaling
disk, as much as the whole warm-session overhead goal. The tracker hands each new version of a record here
and goes on. A run under way is written by whoever follows it, on its polls once the interval has passed
(:meth:`RecordWriter.tick`): a second thread writing while the follower reads the run's output would take
the GIL from it, and a thread the OS pauses while holding the GIL holds up every line printed. The end of a
run is written by a daemon thread, with every other change, once per interval: a burst of warm cells costs
one wake-up per interval, not a write per cell. What is not yet written is written by
:meth:`RecordWriter.flush`, which runs at interpreter exit too.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable

from .records import KEEP_FINISHED, RunBook, RunEntry

Write = Callable[[RunBook, RunEntry], None]


class RecordWriter:
    """Writes records through ``write`` at most ``every`` seconds after they changed, in the order given."""

    def __init__(self, write: Write, every: float) -> None:
        self._write = write
        self._every = every
        self._changed = threading.Condition()
        self._due: dict[str, tuple[RunBook, RunEntry]] = {}
        """The newest unwritten version of each changed record, by run id, with the book it goes to."""
        self._since: dict[str, float] = {}
        """When each record was last written, or first changed (a run's record waits an interval either way)."""
        self._writing = threading.Lock()
        """One batch at a time: the order records are taken in is the order they reach the disk."""
        self._thread: threading.Thread | None = None
        self._gathering = False
        """A run's end waits in ``_due``: the thread is gathering the batch it belongs to."""
        _WRITERS.add(self)

    def put(self, book: RunBook, record: RunEntry) -> None:
        """Write ``record`` with the next batch if its run ended, else on a :meth:`tick` once an interval has
        passed since it was last written (a newer version of the same run replaces it)."""
        with self._changed:
            self._due[record.run_id] = (book, record)
            self._since.setdefault(record.run_id, time.monotonic())
            if not record.finished or self._gathering:
                return  # a run under way waits for its follower's tick; an end joins the batch gathering
            self._gathering = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gpuo-run-book", daemon=True)
                self._thread.start()
            self._changed.notify()

    def tick(self, run_id: str) -> None:
        """Write ``run_id``'s record now, in this thread, if it changed and an interval has passed since it was
        last written (its follower calls this on every poll)."""
        now = time.monotonic()
        with self._changed:
            if run_id not in self._due or now - self._since.get(run_id, now) < self._every:
                return
        with self._writing:
            with self._changed:
                entry = self._due.pop(run_id, None)
                self._since[run_id] = now
            if entry is not None:
                self._write(*entry)

    def pending(self) -> bool:
        """Whether changed records wait to be written."""
        with self._changed:
            return bool(self._due)

    def flush(self) -> None:
        """Write every changed record now, in this thread."""
        with self._writing:
            with self._changed:
                batch, self._due = list(self._due.values()), {}
                self._gathering = False
                for _, record in batch:
                    if record.finished:
                        self._since.pop(record.run_id, None)
            for book, record in _kept(batch):
                self._write(book, record)

    def _loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._gathering)
            # the batch gathers whatever else changes meanwhile: a run of warm cells is one write each, once
            time.sleep(self._every)
            self.flush()


def _kept(batch: list[tuple[RunBook, RunEntry]]) -> list[tuple[RunBook, RunEntry]]:
    """The batch without the finished records its own prune would delete at once: beyond the newest
    :data:`~.records.KEEP_FINISHED` finished ones (a loop of warm cells can finish hundreds per batch)."""
    finished = [index for index, (_, record) in enumerate(batch) if record.finished]
    surplus = set(finished[: max(0, len(finished) - KEEP_FINISHED)])
    return [entry for index, entry in enumerate(batch) if index not in surplus] if surplus else batch


_WRITERS: weakref.WeakSet[RecordWriter] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    """A kernel or ``gpu-offload run`` that exits leaves every record it changed written."""
    for writer in list(_WRITERS):
        writer.flush()
