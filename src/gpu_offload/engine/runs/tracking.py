"""The run book's listener at the engine's event boundary: every run a front end starts is recorded.

:class:`Tracker` subscribes to the engine's run events (:mod:`..observing`): it records a run before it is
submitted, each event after it (state, output tail, GPU metrics), and its end. It stops a run only through
the run's cancel handle: asked by the panel of this kernel, or through the state directory by another
kernel, the runs REST API or ``gpu-offload cancel``. It changes nothing the engine receives.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from ...runner.frames import Done, Hello, Metrics, Status, Stream
from ..backends.base import Job, Placed, Queued, RunEvent, RunnerExit
from ..backends.kube.config import kernel_id
from ..observing import CancelHandle, RunStarted
from ..sinks import PREFIX
from ..timing import Stopwatch
from .records import MAX_SAMPLES, RunBook, RunEntry, StateDirRefused, add_output
from .writer import RecordWriter

WRITE_EVERY = 0.5
"""Seconds between two batches of record writes (:mod:`.writer`): the longest a change takes to reach the
state directory, where other kernels, the runs REST API and ``gpu-offload runs`` read it."""
CANCEL_POLL = 0.25
"""Seconds between checks for a cancel request file from another kernel or the server extension."""


PRUNE_EVERY = 5
"""Finished runs between two prunes: even listing the state directory costs a warm cell a fraction of a
millisecond; the directory may grow by this many records past the prune's slack between two prunes."""


def gpu_point(metrics: Metrics) -> tuple[float, float] | None:
    """Mean utilization in percent and memory used as a fraction of the total, over the sample's GPUs."""
    utils = [g.util for g in metrics.gpu if g.util is not None]
    used = sum(g.mem_used for g in metrics.gpu if g.mem_used is not None and g.mem_total)
    total = sum(g.mem_total for g in metrics.gpu if g.mem_used is not None and g.mem_total)
    if not utils and not total:
        return None
    return (sum(utils) / len(utils) if utils else 0.0, used / total if total else 0.0)


def _with(record: RunEntry, **changes: Any) -> RunEntry:
    """``dataclasses.replace`` without its per-call field introspection: this runs once per runner event."""
    new = object.__new__(RunEntry)
    new.__dict__.update(record.__dict__, **changes)
    return new


def observe(record: RunEntry, event: RunEvent) -> RunEntry:
    """The record after ``event`` (pure; the engine sees the event unchanged)."""
    if isinstance(event, Status):
        if record.state == "queued" and record.detail:
            # the pod's own status while Kueue holds it says less than its place in line, and may arrive after
            # it: the run stays queued until Kueue admits it (a Queued event that is no longer waiting)
            return record
        state = record.state if record.state == "running" else "scheduling"
        return _with(record, state=state, detail=event.state)
    if isinstance(event, Queued):  # waiting in Kueue's line, then admitted (on to scheduling)
        return _with(record, state="queued" if event.waiting else "scheduling", detail=event.text)
    if isinstance(event, Placed) and event.cluster and event.cluster != record.cluster:
        return _with(record, cluster=event.cluster)  # a queued run's cluster is known once Kueue admitted it
    if isinstance(event, Hello):
        return _with(record, state="running", detail=f"runner on Python {event.python}")
    if isinstance(event, Stream):
        return _with(record, state="running", tail=add_output(record.tail, event.text))
    if isinstance(event, Metrics):
        point = gpu_point(event)
        if point is None:
            return _with(record, detail=event.note or record.detail)
        return _with(record, util=(*record.util, point[0])[-MAX_SAMPLES:],
                       mem=(*record.mem, point[1])[-MAX_SAMPLES:])
    if isinstance(event, Done):
        state = "done" if event.status == "ok" else "failed"
        detail = "" if state == "done" else event.status
        return _with(record, state=state, detail=record.detail if record.detail == "cancelled" else detail,
                       ended=time.time())
    if isinstance(event, RunnerExit) and not record.finished:
        why = f"the runner exited with code {event.code}" + (f": {event.detail}" if event.detail else "")
        why = "cancelled" if record.detail == "cancelled" else why
        return _with(record, state="failed", detail=why, ended=time.time())
    return record


@dataclass
class _Live:
    """What the tracker holds of a run under way: how to stop it, and when it last looked for a request."""

    cancel: CancelHandle
    clock: Stopwatch | None
    polled: float = 0.0
    cancelled: bool = False
    """A cancel was asked for: the record says so from the follower's next note on (only the follower's
    thread writes a live run's record)."""


class Tracker:
    """The runs of this kernel: their records (also written to the state directory) and their cancel handles.

    A :class:`~..observing.RunListener`: subscribe it to a front end's run events. ``write_every``: seconds
    between two batches of record writes (:class:`~.writer.RecordWriter`).
    """

    def __init__(self, book: RunBook | None = None, kernel: str | None = None, script: str | None = None,
                 log: str = "", write_every: float = WRITE_EVERY) -> None:
        self.book = book or RunBook()
        self.kernel = kernel or kernel_id(os.environ)
        self.script = script
        """The command line of the script this process runs (``gpu-offload run``), written on its records."""
        self.log = log
        self.pid = os.getpid()
        self._records: dict[str, RunEntry] = {}
        self._books: dict[str, RunBook] = {}
        """Each run under way's book, at the directory the setting named when the run began."""
        self._writer = RecordWriter(self._write, write_every)
        self._runs: dict[str, _Live] = {}
        self._since_prune = PRUNE_EVERY - 1  # the first finished run prunes what earlier kernels left
        self._changed = threading.Condition()
        self.version = 0
        """Increases with every change; :meth:`wait_change` waits for it to move."""
        self.refused: str | None = None
        """Why the state directory is not written (it is not this user's alone), once that was found."""

    def new(self, job: Job, backend: str) -> RunEntry:
        """Record a run about to be submitted (state ``queued``)."""
        cluster = "local" if backend == "local" else job.request.cluster
        record = RunEntry(job.run_id, self.kernel, self.pid, backend, cluster, job.request.gpus, session=job.session,
                          script=self.script, log=self.log)
        book = self._books[job.run_id] = self.book.pinned()
        try:
            book.check()  # once per directory: a refusal is said at the cell that first meets it
        except StateDirRefused as exc:
            self._refuse(exc)
        self.put(record)
        return record

    def put(self, record: RunEntry) -> None:
        """Store a new version of a record; written to the state directory with the writer's next batch."""
        self._records[record.run_id] = record
        self._writer.put(self._book(record.run_id), record)
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def flush(self) -> None:
        """Write every changed record now (the writer's thread otherwise does within WRITE_EVERY)."""
        self._writer.flush()

    def _write(self, book: RunBook, record: RunEntry) -> None:
        if self.refused is not None:
            return
        try:
            book.write(record)
            if record.finished:
                book.forget_cancel(record.run_id)
                self._since_prune += 1
                if self._since_prune >= PRUNE_EVERY:
                    self._since_prune = 0
                    book.prune()
        except StateDirRefused as exc:
            self._refuse(exc)
        except OSError:
            pass  # an unwritable state dir hides this run from other kernels only; the run itself goes on

    def _refuse(self, exc: StateDirRefused) -> None:
        # tracking goes off for this kernel: nothing is written where others could read or redirect it
        if self.refused is None:
            self.refused = f"run tracking is off: {exc}"
            sys.stderr.write(f"{PREFIX}{self.refused}\n")

    def _book(self, run_id: str) -> RunBook:
        return self._books.get(run_id) or self.book

    def wait_change(self, seen: int, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for a change after version ``seen``; returns the current version."""
        with self._changed:
            self._changed.wait_for(lambda: self.version != seen, timeout)
            return self.version

    def wake(self) -> None:
        """Wake every :meth:`wait_change` (a panel that is closing should not wait out its interval)."""
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def records(self) -> list[RunEntry]:
        """This kernel's records, as they are now (fresher than the throttled files)."""
        return list(self._records.values())

    # -- the engine's run events (a RunListener) ----------------------------------------------------------

    def submitting(self, job: Job, backend: str) -> None:
        """Record a run about to be submitted (state ``queued``)."""
        self.new(job, backend)

    def not_started(self, job: Job, error: BaseException) -> None:
        """The backend did not start it: failed, saying why."""
        record = self._records.get(job.run_id)
        if record is not None:
            self.put(replace(record, state="failed", detail=str(error) or type(error).__name__, ended=time.time()))
        self._books.pop(job.run_id, None)

    def started(self, run: RunStarted) -> None:
        """The backend took it: scheduling, on the cluster the backend chose (``--cluster auto`` resolved)."""
        record = self._records.get(run.job.run_id)
        if record is None:
            return
        job = run.job
        detail = "waiting for a free runner" if job.session is None else f"in session {job.session}"
        # the first look for a cancel request from elsewhere comes after CANCEL_POLL, not at the first event:
        # a warm cell is over by then, and the look cost it a system call
        self._runs[job.run_id] = _Live(run.cancel, job.clock, polled=time.monotonic())
        self.put(_with(record, state="scheduling", detail=detail, cluster=run.cluster))

    def event(self, run_id: str, event: RunEvent) -> None:
        """One event of a run: its record follows (written in the writer's batches), and cancel requests are
        looked for."""
        record = self._records.get(run_id)
        if record is None:
            return
        live = self._runs.get(run_id)
        if live is not None and live.cancelled and record.detail != "cancelled" and not record.finished:
            record = replace(record, detail="cancelled")  # what Done and RunnerExit keep as the reason
        updated = observe(record, event)
        if isinstance(event, Done) and live is not None and live.clock is not None:
            # in the record's one write at the end: a warm cell cannot afford a second
            live.clock.mark("done")
            updated = _with(updated, timing=live.clock.record())
        if updated is not self._records[run_id]:
            self.put(updated)
        self.waiting(run_id)

    def waiting(self, run_id: str) -> None:
        """A poll of a quiet run: write its record once due; act on a cancel request from elsewhere."""
        live = self._runs.get(run_id)
        if live is not None:
            now = time.monotonic()
            if now - live.polled >= CANCEL_POLL:
                live.polled = now
                book = self._book(run_id)
                if book.cancel_requested(run_id):
                    book.forget_cancel(run_id)
                    self.cancel(run_id)
            record = self._records.get(run_id)
            if live.cancelled and record is not None and record.detail != "cancelled" and not record.finished:
                self.put(replace(record, detail="cancelled"))
        self._writer.tick(run_id)

    def ended(self, run_id: str) -> None:
        """Released: a run that never reported an end is recorded as failed (written with the next batch)."""
        live = self._runs.pop(run_id, None)
        record = self._records.get(run_id)
        if record is None:
            return
        if live is not None and live.clock is not None and record.timing is None:
            record = replace(record, timing=live.clock.record())
        if not record.finished:
            record = replace(record, state="failed", ended=time.time(),
                             detail=record.detail or "stopped before it reported an end")
        if record is not self._records[run_id]:
            self.put(record)
        self._books.pop(run_id, None)

    def cancel(self, run_id: str) -> bool:
        """Stop a run of this process through its cancel handle: the first request interrupts it as Ctrl-C
        would, a second kills its runner. ``False`` if it is not under way here."""
        live = self._runs.get(run_id)
        record = self._records.get(run_id)
        if live is None or record is None or record.finished:
            return False
        live.cancelled = True
        live.cancel.cancel()
        with self._changed:  # a panel waiting for a change looks again
            self.version += 1
            self._changed.notify_all()
        return True


_TRACKER: Tracker | None = None
_LOCK = threading.Lock()


def tracker() -> Tracker:
    """This kernel's tracker (made on first use)."""
    global _TRACKER
    with _LOCK:
        if _TRACKER is None:
            _TRACKER = Tracker()
        return _TRACKER
