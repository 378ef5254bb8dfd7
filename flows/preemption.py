"""A queued step's Job as Kueue moves it, and what the run says about it (pure: no I/O, no clock of its own).

Kueue admits a queued step's Job by unsuspending it; when it preempts the step it suspends the Job again
(its pod is deleted) and requeues its Workload, and Metaflow's ``kubernetes step`` keeps waiting without a word.
Once Kueue admits the Job again a new pod runs the step from its start. :class:`JobTracker` turns the Job's
successive states into those two moments (``Stopped``, ``Readmitted``); the sentences say them to the user.
Everything read from a Job is untrusted (any writer of Jobs in the namespace could set the run's label), so
names are bounded and printable and the number of Jobs followed is capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_offload.liqo_peering.kueue_stop import preempted_by
from gpu_offload.liqo_peering.untrusted_text import shown
from gpu_offload.liqo_peering.wording import duration, ordinal

MAX_JOBS = 1000
"""Jobs of one run followed at most (a foreach step has one per task and attempt)."""
_FINISHED = ("Complete", "Failed")


@dataclass(frozen=True)
class StepJob:
    """A step's Job as its Metaflow annotations name it (shown as they are, bounded)."""

    name: str
    uid: str
    step: str
    task: str
    attempt: str

    def path(self, run_id: str) -> str:
        """Metaflow's name of the task, as its own log lines start: ``run/step/task``."""
        return f"{run_id}/{self.step}/{self.task}"


@dataclass(frozen=True)
class Stopped:
    """Kueue suspended the Job after having admitted it (``ran`` seconds before)."""

    job: StepJob
    ran: float


@dataclass(frozen=True)
class Readmitted:
    """Kueue admitted the Job again after stopping it (``waited`` seconds in line)."""

    job: StepJob
    waited: float


@dataclass
class _Seen:
    suspended: bool
    since: float
    """When the Job was last seen to change between suspended and running (the tracker's clock)."""
    stopped: bool = False


def step_job(job: Mapping[str, Any]) -> StepJob:
    """The step's Job as the tracker names it."""
    meta = job.get("metadata") or {}
    notes = meta.get("annotations") or {}
    return StepJob(shown(meta.get("name") or "", 63), str(meta.get("uid") or ""),
                   shown(notes.get("metaflow/step_name") or "?", 63), shown(notes.get("metaflow/task_id") or "?", 63),
                   shown(notes.get("metaflow/attempt") or "0", 8))


def _finished(job: Mapping[str, Any]) -> bool:
    return any(c.get("type") in _FINISHED and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


class JobTracker:
    """Follows the suspension of a run's Jobs; ``seen`` with each new state of one, ``gone`` when deleted."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Seen] = {}

    def seen(self, job: Mapping[str, Any], now: float) -> Stopped | Readmitted | None:
        """What changed for the user with this state of ``job`` (``now`` on any monotonic clock)."""
        uid = str((job.get("metadata") or {}).get("uid") or "")
        if not uid:
            return None
        if _finished(job):
            self._jobs.pop(uid, None)
            return None
        suspended = bool((job.get("spec") or {}).get("suspend"))
        before = self._jobs.get(uid)
        if before is None:
            if len(self._jobs) < MAX_JOBS:
                self._jobs[uid] = _Seen(suspended, now)
            return None
        if suspended == before.suspended:
            return None
        ran_or_waited, before.since, before.suspended = now - before.since, now, suspended
        if suspended:
            before.stopped = True
            return Stopped(step_job(job), ran_or_waited)
        if before.stopped:
            before.stopped = False
            return Readmitted(step_job(job), ran_or_waited)
        return None  # its first admission: Metaflow says the task starts

    def gone(self, job: Mapping[str, Any]) -> None:
        self._jobs.pop(str((job.get("metadata") or {}).get("uid") or ""), None)


@dataclass(frozen=True)
class Place:
    """The Job's place in its LocalQueue, as Kueue's visibility API said it."""

    position: int
    """From 0."""
    total: int
    queue: str

    def text(self) -> str:
        return f"{ordinal(self.position + 1)} of {self.total} in LocalQueue {self.queue}"


def stopped_text(stopped: Stopped, message: str | None, place: Place | None) -> str:
    """The line a run prints when Kueue stopped one of its steps. ``message``: the ``Stopped`` event's (None:
    none was found, the cause is unknown)."""
    job = stopped.job
    by = preempted_by("", message or "") if message is not None else None
    # to the minute, as the cell says how long its preempted run ran: a span said once, its seconds stale when read
    ran = duration(stopped.ran, "min")
    if by is not None:
        what = f"was preempted {by} after {ran}"
    elif message:
        what = f"was stopped by Kueue after {ran} ({shown(message)})"
    else:
        what = f"was stopped after {ran}: its Job {job.name} was suspended (Kueue evicted it)"
    line = f"; {place.text()}" if place is not None else ""
    return (f"gpu-offload: step {job.step} (task {job.task}, attempt {job.attempt}) {what}. Its pod is gone and "
            f"what it had done is lost; it waits in Kueue's queue again{line} and will rerun from its start once "
            "admitted; a higher priority (@gpu_offload(priority=...)), if you may use one, is preempted less")


def readmitted_text(readmitted: Readmitted) -> str:
    job = readmitted.job
    return (f"gpu-offload: step {job.step} (task {job.task}, attempt {job.attempt}) admitted by Kueue again after "
            f"{duration(readmitted.waited)} in line; it reruns from its start")
