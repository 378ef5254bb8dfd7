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

WRITE_EVERY = 0.5
"""Seconds between writes of a record whose state did not change (output and metrics are throttled)."""
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

    A :class:`~..observing.RunListener`: subscribe it to a front end's run events.
    """

    def __init__(self, book: RunBook | None = None, kernel: str | None = None, script: str | None = None,
                 log: str = "") -> None:
        self.book = book or RunBook()
        self.kernel = kernel or kernel_id(os.environ)
        self.script = script
        """The command line of the script this process runs (``gpu-offload run``), written on its records."""
        self.log = log
        self.pid = os.getpid()
        self._records: dict[str, RunEntry] = {}
        self._books: dict[str, RunBook] = {}
        """Each run under way's book, at the directory the setting named when the run began."""
        self._written: dict[str, float] = {}
        self._dirty: set[str] = set()
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
        self._books[job.run_id] = self.book.pinned()
        self.put(record)
        return record

    def put(self, record: RunEntry) -> None:
        """Store a new version of a record; written at once when the run ends, else at most every WRITE_EVERY."""
        old = self._records.get(record.run_id)
        self._records[record.run_id] = record
        now = time.monotonic()
        if old is None and not record.finished:
            # Written once it has lasted WRITE_EVERY (by tick) or when it ends: most warm cells end within
            # milliseconds, and each write costs a rename (about 0.5 ms on a journaling disk), which the
            # warm-session overhead goal (2 ms) cannot afford four times per cell.
            self._written[record.run_id] = now
            self._dirty.add(record.run_id)
        elif record.finished or now - self._written.get(record.run_id, 0.0) >= WRITE_EVERY:
            self._written[record.run_id] = now
            self._dirty.discard(record.run_id)
            self._write(record)
        else:
            self._dirty.add(record.run_id)  # written by tick() once due, even if no further event comes
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def _write(self, record: RunEntry) -> None:
        if self.refused is not None:
            return
        book = self._book(record.run_id)
        try:
            book.write(record)
            if record.finished:
                book.forget_cancel(record.run_id)
                self._since_prune += 1
                if self._since_prune >= PRUNE_EVERY:
                    self._since_prune = 0
                    book.prune()
        except StateDirRefused as exc:
            # tracking goes off for this kernel: nothing is written where others could read or redirect it
            self.refused = f"run tracking is off: {exc}"
            sys.stderr.write(f"{PREFIX}{self.refused}\n")
        except OSError:
            pass  # an unwritable state dir hides this run from other kernels only; the run itself goes on

    def _book(self, run_id: str) -> RunBook:
        return self._books.get(run_id) or self.book

    def tick(self, run_id: str) -> None:
        """Write a throttled change once its time has come (the follower calls this on every poll)."""
        if run_id in self._dirty and time.monotonic() - self._written.get(run_id, 0.0) >= WRITE_EVERY:
            self.flush(run_id)

    def flush(self, run_id: str) -> None:
        """Write the latest version of a record now, if it has changes not yet written."""
        if run_id not in self._dirty:
            return
        record = self._records.get(run_id)
        self._dirty.discard(run_id)
        if record is not None:
            self._written[run_id] = time.monotonic()
            self._write(record)

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
        self.put(replace(record, state="scheduling", detail=detail, cluster=run.cluster))

    def event(self, run_id: str, event: RunEvent) -> None:
        """One event of a run: its record follows (written throttled), and cancel requests are looked for."""
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
            updated = replace(updated, timing=live.clock.record())
        if updated is not self._records[run_id]:
            self.put(updated)
        self.waiting(run_id)

    def waiting(self, run_id: str) -> None:
        """A poll of a quiet run: write what was throttled once due; act on a cancel request from elsewhere."""
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
        self.tick(run_id)

    def ended(self, run_id: str) -> None:
        """Released: a run that never reported an end is recorded as failed; the record is written now."""
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
        self.flush(run_id)
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
