"""Telling a ``python flow.py run`` user that Kueue preempted a queued step, which Metaflow does not.

When Kueue preempts a queued step it suspends the step's Job and requeues it; Metaflow's ``kubernetes step``
waits on without a word and the step reruns from its start once Kueue admits the Job again. Metaflow has no
hook while that command waits, so the run process follows the run's Jobs itself: the internal decorator
calls :func:`watch_queued_step` when it completes a queued step's command, which starts (once per run and
namespace) a ``liqo_peering.watching.ListWatch`` of the Jobs carrying the run's label, the project's one
watch loop, in a daemon thread; :func:`stop_watches` (the decorator's ``runtime_finished``) ends them all.
A stopped Job is said with the ``Stopped`` event Kueue recorded on it (looked for a few seconds, with the
project's one retry policy) and, when Kueue's visibility API answers, its place in line.

Nothing here may break a step: every failure is swallowed or said in one line, and the watch's thread is
a daemon, stopped when the run ends.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from datetime import datetime
from typing import Any

from gpu_offload.liqo_peering.labels import QUEUE_NAME_LABEL
from gpu_offload.liqo_peering.retrying import Backoff, retry
from gpu_offload.liqo_peering.watching import Event, ListResult, ListWatch

from .cluster_reader import StepJobs
from .kubernetes_args import RUN_LABEL, label_value
from .preemption import JobTracker, Place, Readmitted, Stopped, readmitted_text, stopped_text

WHY_STOPPED = Backoff(first=0.25, cap=2.0, attempts=8)
"""Looking for the ``Stopped`` event of a Job just suspended (Kueue records it right after): about 8 s in all."""
FIND_PLACE = Backoff(first=0.25, cap=1.0, attempts=5)
"""Looking for the requeued Job in its LocalQueue's pending workloads: a few seconds, then it is said without."""

_WATCHES: dict[tuple[str, str, str], StepWatch] = {}
_LOCK = threading.Lock()


class _NotYet(Exception):
    """The ``Stopped`` event is not there yet."""


def _write(line: str) -> None:
    # one write per line, as Metaflow's own log lines look (timestamp, then the task's path): the runtime's
    # thread prints too
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class StepWatch:
    """The ``ListWatch`` sink of one run's Jobs: says each stop and readmission of a step."""

    def __init__(self, jobs: StepJobs, run_id: str, queue: str, write: Callable[[str], None] = _write) -> None:
        self._jobs = jobs
        self._run_id = run_id
        self._queue = queue
        self._write = write
        self._tracker = JobTracker()
        self._closing = threading.Event()
        self._loop = ListWatch(jobs.collection.what, lambda: jobs.collection.list(5.0), jobs.collection.watch, self)

    def start(self) -> StepWatch:
        self._loop.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._loop.close()
        self._jobs.close()

    def listed(self, result: ListResult) -> None:
        for job in result.items:
            self._saw(job)

    def event(self, event: Event) -> None:
        job = event.get("object") or {}
        if event.get("type") == "DELETED":
            self._tracker.gone(job)
        elif event.get("type") in ("ADDED", "MODIFIED"):
            self._saw(job)

    def failed(self, exc: Exception) -> None:
        # the loop tries again with the project's backoff; a step is never failed for its watch
        pass

    def _saw(self, job: dict[str, Any]) -> None:
        change = self._tracker.seen(job, time.monotonic())
        if isinstance(change, Stopped):
            self._say(change.job.path(self._run_id), stopped_text(change, self._why(change), self._place(change)))
        elif isinstance(change, Readmitted):
            self._say(change.job.path(self._run_id), readmitted_text(change))

    def _why(self, stopped: Stopped) -> str | None:
        def read() -> str:
            message = self._jobs.stop_message(stopped.job.name, stopped.job.uid)
            if message is None:
                raise _NotYet
            return message

        try:
            return retry(read, WHY_STOPPED, lambda exc: isinstance(exc, _NotYet), stop=self._closing)
        except _NotYet:
            return None

    def _place(self, stopped: Stopped) -> Place | None:
        # Kueue requeues the Workload once the Job's pods are gone, a moment after the event
        def read() -> Place:
            found = self._jobs.place(self._queue, stopped.job.name)
            if found is None:
                raise _NotYet
            return Place(found[0], found[1], self._queue)

        try:
            return retry(read, FIND_PLACE, lambda exc: isinstance(exc, _NotYet), stop=self._closing)
        except _NotYet:
            return None

    def _say(self, path: str, text: str) -> None:
        if self._closing.is_set():
            return  # the run ended meanwhile: a line after its end would only confuse
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        self._write(f"{stamp} [{path}] {text}")


def queued_step(commands: list[str], command_options: MutableMapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, run id, LocalQueue) of a ``kubernetes step`` command whose Job queues in Kueue, else None."""
    if commands[:2] != ["kubernetes", "step"]:
        return None
    try:
        labels = json.loads(command_options.get("labels") or "{}")
    except ValueError:
        return None
    queue, run_id = labels.get(QUEUE_NAME_LABEL), command_options.get("run-id")
    namespace = command_options.get("k8s_namespace")  # @kubernetes's `namespace`, named so on the command
    if not (queue and run_id and namespace):
        return None
    return str(namespace), str(run_id), str(queue)


def watch_queued_step(commands: list[str], command_options: MutableMapping[str, Any]) -> None:
    """Follow the run's Jobs in the step's namespace (once per run and namespace) when the step queues."""
    from .live import kubeconfig_path

    found = queued_step(commands, command_options)
    where = kubeconfig_path()
    if found is None or where is None:
        return
    namespace, run_id, queue = found
    with _LOCK:
        if (where, namespace, run_id) in _WATCHES:
            return
        try:
            jobs = StepJobs(where, namespace, f"{RUN_LABEL}={label_value(run_id)}")
            _WATCHES[(where, namespace, run_id)] = StepWatch(jobs, run_id, queue).start()
        except Exception as exc:  # noqa: BLE001 - the step runs all the same, unwatched
            _write(f"gpu-offload: the queued steps of run {run_id} are not watched ({exc}); if Kueue preempts one, "
                   "it waits in line again without a word and reruns from its start once admitted")


def stop_watches() -> None:
    """End every watch this process started (the run ended)."""
    with _LOCK:
        watches = list(_WATCHES.values())
        _WATCHES.clear()
    for watch in watches:
        watch.close()
