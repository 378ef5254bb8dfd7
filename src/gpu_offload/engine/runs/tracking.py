"""The panel's hook at the engine's event boundary: backends and runs wrapped so that every run is recorded.

:class:`TrackedBackend` records a run before it is submitted; :class:`TrackedRun` sees each event on its way
to the engine (state, output tail, GPU metrics) and polls for cancel requests. Neither changes what the
engine receives, so a tracked run behaves exactly like the backend's own run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...runner.frames import Done, Hello, Metrics, Status, Stream
from ..backends.base import (
    Backend,
    ClusterAccess,
    InventorySource,
    Job,
    Placed,
    Queued,
    Run,
    RunEvent,
    RunnerExit,
    SessionInfo,
    Transfer,
)
from ..backends.kube.config import kernel_id
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


class Tracker:
    """The runs of this kernel: their records (also written to the state directory) and their cancel hooks."""

    def __init__(self, book: RunBook | None = None, kernel: str | None = None, script: str | None = None,
                 log: str = "") -> None:
        self.book = book or RunBook()
        self.kernel = kernel or kernel_id(os.environ)
        self.script = script
        """The command line of the script this process runs (``gpu-offload run``), written on its records."""
        self.log = log
        self.pid = os.getpid()
        self._records: dict[str, RunEntry] = {}
        self._written: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._runs: dict[str, TrackedRun] = {}
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
        try:
            self.book.write(record)
            if record.finished:
                self.book.forget_cancel(record.run_id)
                self._since_prune += 1
                if self._since_prune >= PRUNE_EVERY:
                    self._since_prune = 0
                    self.book.prune()
        except StateDirRefused as exc:
            # tracking goes off for this kernel: nothing is written where others could read or redirect it
            self.refused = f"run tracking is off: {exc}"
            sys.stderr.write(f"{PREFIX}{self.refused}\n")
        except OSError:
            pass  # an unwritable state dir hides this run from other kernels only; the run itself goes on

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

    def attach(self, run: TrackedRun) -> None:
        """Remember a live run so a cancel from the panel reaches it directly."""
        self._runs[run.record.run_id] = run

    def detach(self, run_id: str) -> None:
        """Forget a released run."""
        self._runs.pop(run_id, None)

    def cancel(self, run_id: str) -> bool:
        """Interrupt a run of this kernel as Ctrl-C would; ``False`` if it is not running here."""
        run = self._runs.get(run_id)
        if run is None:
            return False
        run.request_cancel()
        return True


class TrackedRun:
    """A backend's run, seen by the tracker; cancel requests interrupt it from the thread that follows it."""

    def __init__(self, inner: Run, record: RunEntry, tracker: Tracker, clock: Stopwatch | None = None) -> None:
        self.inner = inner
        self.clock = clock
        self.record = record
        self._tracker = tracker
        self._cancels = 0
        self._acted = 0
        self._polled = 0.0
        self._on_cancel: Callable[[], None] | None = None
        tracker.attach(self)

    @property
    def cluster(self) -> str:
        """The backend run's cluster."""
        return self.inner.cluster

    def progress(self) -> str:
        """The backend run's progress."""
        return self.inner.progress()

    def route_cancel(self, cancel: Callable[[], None]) -> None:
        """A ``--noblock`` handle's own cancel: the panel's button then stops the run as ``cancelled``."""
        self._on_cancel = cancel

    def request_cancel(self) -> None:
        """Ask for an interrupt (a second request kills the runner, like a second Ctrl-C)."""
        self._cancels += 1

    def _check_cancel(self) -> None:
        now = time.monotonic()
        if now - self._polled >= CANCEL_POLL:
            self._polled = now
            if self._tracker.book.cancel_requested(self.record.run_id):
                self._tracker.book.forget_cancel(self.record.run_id)
                self._cancels += 1
        if self._cancels <= self._acted or self.record.finished:
            return
        first = self._acted == 0
        self._acted = self._cancels
        self._update(replace(self.record, detail="cancelled"))
        if not first:
            self.inner.kill()
        elif self._on_cancel is not None:
            self._on_cancel()
        elif threading.current_thread() is threading.main_thread():
            # the cell is being followed in the foreground: the engine's own Ctrl-C path (interrupt, grace
            # period, then kill; output kept, no variable copied back) is exactly what the button means
            raise KeyboardInterrupt
        else:
            self.inner.interrupt()

    def _update(self, record: RunEntry) -> None:
        self.record = record
        self._tracker.put(record)

    def next_event(self, timeout: float) -> RunEvent | None:
        """The backend's next event, recorded on the way."""
        self._check_cancel()
        event = self.inner.next_event(timeout)
        if event is not None:
            updated = observe(self.record, event)
            if isinstance(event, Done) and self.clock is not None:
                # in the record's one write at the end: a warm cell cannot afford a second
                self.clock.mark("done")
                updated = replace(updated, timing=self.clock.record())
            if updated is not self.record:
                self._update(updated)
        self._tracker.tick(self.record.run_id)
        return event

    def interrupt(self) -> None:
        """Interrupt the backend's run."""
        self.inner.interrupt()

    def kill(self) -> None:
        """Kill the backend's run."""
        self.inner.kill()

    def release(self, grace: float) -> int | None:
        """Release the backend's run; a run released before it finished is recorded as failed."""
        try:
            return self.inner.release(grace)
        finally:
            if self.clock is not None and self.record.timing is None:
                self._update(replace(self.record, timing=self.clock.record()))
            if not self.record.finished:
                self._update(replace(self.record, state="failed", ended=time.time(),
                                     detail=self.record.detail or "stopped before it reported an end"))
            self._tracker.flush(self.record.run_id)
            self._tracker.detach(self.record.run_id)


class TrackedBackend:
    """A backend whose runs are recorded by ``tracker``; everything else is the backend's own."""

    def __init__(self, inner: Backend, tracker: Tracker) -> None:
        self.inner = inner
        self.tracker = tracker
        self.name = inner.name

    def transfer(self, run_id: str) -> Transfer:
        """The backend's choice."""
        return self.inner.transfer(run_id)

    def describe(self) -> str:
        """The backend's own line."""
        return self.inner.describe()

    def inventory(self) -> InventorySource | None:
        """The backend's inventory."""
        return self.inner.inventory()

    def cluster_access(self) -> ClusterAccess | None:
        """The backend's cluster."""
        return self.inner.cluster_access()

    def trusts(self, cluster: str) -> bool:
        """The backend's trust."""
        return self.inner.trusts(cluster)

    def submit(self, job: Job) -> Run:
        """Record the run as queued, submit it, and follow it through a :class:`TrackedRun`."""
        record = self.tracker.new(job, self.name)
        try:
            run = self.inner.submit(job)
        except BaseException as exc:
            self.tracker.put(replace(record, state="failed", detail=str(exc) or type(exc).__name__, ended=time.time()))
            raise
        detail = "waiting for a free runner" if job.session is None else f"in session {job.session}"
        cluster = run.cluster  # --cluster auto is resolved inside the backend
        return TrackedRun(run, replace(record, state="scheduling", detail=detail, cluster=cluster), self.tracker,
                          job.clock)

    def sessions(self) -> list[SessionInfo]:
        """The backend's sessions."""
        return self.inner.sessions()

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        """Close one of the backend's sessions."""
        return self.inner.close_session(name, grace)

    def close(self) -> None:
        """Close the backend."""
        self.inner.close()


_TRACKER: Tracker | None = None
_LOCK = threading.Lock()


def tracker() -> Tracker:
    """This kernel's tracker (made on first use)."""
    global _TRACKER
    with _LOCK:
        if _TRACKER is None:
            _TRACKER = Tracker()
        return _TRACKER


def tracked(backend: Backend, factory: Callable[[], Tracker] = tracker) -> Backend:
    """``backend`` with its runs recorded (idempotent)."""
    if isinstance(backend, TrackedBackend):
        return backend
    return TrackedBackend(backend, factory())
