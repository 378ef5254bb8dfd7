"""A distributed run (``--nodes N``) in the pods of one Indexed Job, followed as the events of its ranks.

The Job controller creates the pods: the run learns of them through the project's list-then-watch loop
(``watching.ListWatch`` on the run's label selector), until all N are known. Each pod runs the runner as its node's launcher (its group rank is the pod's ``JOB_COMPLETION_INDEX``); its
log is read by the same :class:`~.follow.PodFollower` as a single cell's, told the run's world size so the
frames of every rank of that pod are accepted. :class:`~...ranked.RankedRun` turns the merged events into one
run. A pod that fails (unschedulable, image pull, lost node) ends the run with the reason, naming the first
rank of that pod; every way out deletes the Job with ``propagationPolicy: Background``, which takes its pods,
Secret and Service.

A pod that another cluster might take (the scheduler cannot place it, or its virtual node was lost) before
any rank showed anything of the cell is retried once, as a single cell's pod is: the Job goes (with its pods,
Secret and Service) and the run is launched again elsewhere, avoiding the clusters of the first Job. A cell
pinned with ``--cluster``, or queueing through Kueue (whose ``waitForPodsReady`` requeues a Job that does not
start), gets the first failure instead, saying why it was not moved.

A Job Kueue preempts is suspended by Kueue, and the Job controller deletes its pods: each runner gets SIGTERM
and interrupts its ranks. The run reads why from the ``Stopped`` event Kueue leaves on the Job and ends saying
it was preempted. It is not rerun: the Job is deleted, so Kueue does not start the ranks again unattended once
GPUs free (the requeue of a preempted one-shot cell, ``requeue.py``, is for single pods).
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ....liqo_peering.errors import APIError, APIForbidden, APINotFound, APIUnauthorized
from ....liqo_peering.labels import QUEUE_NAME_LABEL
from ....liqo_peering.rankjob import INDEX_LABEL
from ....liqo_peering.specs import runner_selector
from ....liqo_peering.watching import Event as WatchEvent
from ....liqo_peering.watching import ListResult, ListWatch
from ....runner.frames import DisplayData, Done, Error, Event, Outputs, Stream
from ...timing import Phase
from ..base import Placed, Queued, Ranks, Relaunched, RunEvent, RunnerExit
from .explain import FAILED, PodState, ran_for, stopped_by_kueue
from .follow import PodEnded, PodFollower
from .host import WHY_STOPPED_SECONDS, Backlog, Host, InLine, Launched, failure_events
from .plan import PodOrder
from .pods import PodApi

LASTING = (APIUnauthorized, APIForbidden, APINotFound)
"""Failures of the pods' list or watch that trying again does not mend (the loop retries the others)."""
POLL = 0.05
"""Longest pause between looks at the followers' queues."""
NOT_RERUN = (". A distributed run is not rerun: its Job is deleted with its pods, so Kueue does not start its "
             "ranks again unattended once GPUs free")


def pod_index(pod: Mapping[str, Any], nodes: int) -> int | None:
    """The pod's index in its Indexed Job (its node rank), or None when it has none in range (a pod's labels
    are not trusted to be what the Job controller wrote)."""
    text = ((pod.get("metadata") or {}).get("labels") or {}).get(INDEX_LABEL)
    try:
        index = int(str(text))
    except ValueError:
        return None
    return index if 0 <= index < nodes else None


class RunPods:
    """The ``watching.Sink`` of the run's pods: hands each pod the loop sees to the run's thread, which starts
    one follower per index (a pod seen again is ignored there)."""

    def __init__(self) -> None:
        self.seen: queue.Queue[dict[str, Any]] = queue.Queue()
        self.error: Exception | None = None
        """The last failure of the list or watch (None once one went well)."""

    def listed(self, result: ListResult) -> None:
        self.error = None
        for pod in result.items:
            self.seen.put(pod)

    def event(self, event: WatchEvent) -> None:
        self.error = None
        if event.get("type") in ("ADDED", "MODIFIED") and isinstance(event.get("object"), dict):
            self.seen.put(event["object"])

    def failed(self, exc: Exception) -> None:
        self.error = exc


class JobPods:
    """The pods of one Indexed Job, each followed by its own :class:`~.follow.PodFollower` (told the world
    size, so the frames of every rank of that pod are accepted) as the watch on the run's pods reports them."""

    def __init__(self, pods: PodApi, order: PodOrder, ranks: Ranks, job: Launched, watch_seconds: int,
                 on_end: Callable[[PodFollower], None] | None = None) -> None:
        """``on_end``: called from a follower's thread when its pod ends (a distributed session acts on it while
        idle)."""
        self.pods = pods
        self._on_end = on_end
        self._order = order
        self._ranks = ranks
        self._job = job
        self._watch_seconds = watch_seconds
        self.followers: dict[int, PodFollower] = {}
        """Node rank -> the follower of that pod."""
        self.ended: set[int] = set()
        """Node ranks whose pod ended (its ``PodEnded`` was taken)."""
        self._found = RunPods()
        collection = pods.pods_matching(runner_selector(run_id=order.run_id))
        self._watch: ListWatch | None = ListWatch(f"pods of Job {job.name}", collection.list, collection.watch,
                                                  self._found, watch_seconds=watch_seconds).start()

    @property
    def watch_error(self) -> Exception | None:
        """The last failure of the watch on the Job's pods, None while it goes well."""
        return self._found.error

    @property
    def all_running(self) -> bool:
        """Every pod exists and its runner container runs (a session may attach to each)."""
        return len(self.followers) == self._ranks.nodes and all(f.running.is_set() for f in self.followers.values())

    def discover(self) -> None:
        """Follow the Job's pods as the watch reports them (one follower per index), each until its container
        ends: a pod's launcher sends one ``done`` per rank (and a session's many), and a one-shot follower
        stops at the first. The watch ends once every index has its follower."""
        if self._watch is None:
            return
        if isinstance(self._found.error, LASTING):
            raise self._found.error
        while len(self.followers) < self._ranks.nodes:
            try:
                pod = self._found.seen.get_nowait()
            except queue.Empty:
                return
            index = pod_index(pod, self._ranks.nodes)
            if index is None or index in self.followers:
                continue
            self.followers[index] = PodFollower(
                self.pods, pod, self._order.nonce, self._job.ctx, one_shot=False, watch_seconds=self._watch_seconds,
                run_id=self._order.bundle_run, ranks=self._ranks.world_size, stdin=self._job.stdin or None,
                on_end=self._on_end)
        self._stop_watching()

    def _stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.close(timeout=0)  # the thread ends on its own once its request is shut
            self._watch = None

    def next(self, timeout: float) -> tuple[int, Event | Placed | Phase | PodEnded] | None:
        """The next item of any pod still followed (and the pod's node rank) within ``timeout`` s, else None;
        a ``PodEnded`` marks its pod ended."""
        deadline = time.monotonic() + timeout
        while True:
            self.discover()
            for index, follower in list(self.followers.items()):
                if index in self.ended:
                    continue
                item = follower.next(0)
                if item is None:
                    continue
                if isinstance(item, PodEnded):
                    self.ended.add(index)
                return index, item
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(POLL, remaining))

    def stop(self) -> None:
        """Stop watching for pods and following every pod."""
        self._stop_watching()
        for follower in self.followers.values():
            follower.stop()


def kueue_stop(pods: PodApi, job: Launched, followers: Iterable[PodFollower], nodes: int,
               wait: float = WHY_STOPPED_SECONDS) -> PodState | None:
    """How Kueue stopped the Job, in words, from the ``Stopped`` event it records on a Job it suspends (looked
    for during ``wait`` seconds: it follows the suspension); None when there is none (or events are not
    readable: the ranks' own words stand)."""
    uid = str((job.owner.get("metadata") or {}).get("uid") or "")
    deadline = time.monotonic() + wait
    while True:
        try:
            event = pods.stop_event(job.name, uid, kind="Job")
        except APIError:
            return None
        if event is not None:
            break
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
    started = min((f.started_at for f in followers if f.started_at), default=None)
    stopped = str(event.get("lastTimestamp") or event.get("eventTime") or "")
    # the Job's GPUs, all of its pods' (a PodContext counts one pod's)
    ctx = dataclasses.replace(job.ctx, gpus=job.ctx.gpus * nodes)
    return stopped_by_kueue("", str(event.get("message") or ""), ran_for(started, stopped), ctx)


def pod_failure(index: int, ended: PodEnded, diagnostics: str, ranks: Ranks, text: str | None = None) -> list[RunEvent]:
    """The events of a pod that failed (unschedulable, image pull, lost node): its reason (or ``text``) as the
    error of the pod's first rank (``node I: ...``), then the exit."""
    state = ended.state
    events = failure_events(dataclasses.replace(state, text=f"node {index}: {text or state.text}"),
                            state.exit_code, diagnostics)
    rank = index * ranks.procs_per_node
    return [dataclasses.replace(e, rank=rank) if isinstance(e, Error) else e for e in events]


class KubeJobRun:
    """One bundle as the ranks of an Indexed Job's pods."""

    def __init__(self, host: Host, order: PodOrder) -> None:
        assert order.placement.ranks is not None, "a distributed run has ranks"
        self.pods = host.pods
        self._host = host
        self._order = order
        self._run_id = order.run_id
        self._ranks = ranks = order.placement.ranks
        self._watch_seconds = host.watch_seconds
        self.job = host.launch(order)
        self._nodes = JobPods(self.pods, order, ranks, self.job, self._watch_seconds)
        self._codes: list[int] = []
        self._backlog = Backlog()
        self._released = False
        self._retried = False
        self._shown = False
        """Whether a rank has shown anything of the cell (output, outputs, an error, its end): a run that
        has is never launched again (its cell would run twice)."""
        self._since = time.monotonic()
        self._interrupting = False
        """This kernel stopped the run (Ctrl-C, release): an interrupted rank is no news from outside."""
        self._asked_why = False
        """Whether the Job's events were read for a stop from outside (once a run)."""
        self._ticket = self.job.ticket
        """The Job's place in Kueue's line while Kueue holds it back (queueing on)."""
        self._line = InLine()

    @property
    def cluster(self) -> str:
        return self.job.ctx.cluster

    @property
    def _gated(self) -> bool:
        # Kueue keeps a queued Job suspended, so it has no pod until admitted
        return not self._nodes.followers

    def progress(self) -> str:
        if self._ticket is not None and self._gated and not self._backlog.over:
            return self._ticket.text()
        started, error = len(self._nodes.followers), self._nodes.watch_error
        return (f"Job {self.job.name} on {self.cluster}: {started} of {self._ranks.nodes} pod(s) created, "
                f"{time.monotonic() - self._since:.0f} s" + (f" (watching its pods failed: {error})" if error else ""))

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.engine.backends.base.Run.next_event`."""
        deadline = time.monotonic() + timeout
        while True:
            if self._backlog.due:
                return self._backlog.take()
            queued = self._queue_event()
            if queued is not None:
                return queued
            got = self._nodes.next(max(0.0, deadline - time.monotonic()))
            if got is None:
                return None
            index, item = got
            if self._from_outside(item) and self._kueue_stopped():
                continue
            if isinstance(item, PodEnded):
                self._pod_ended(index, item)
                continue
            if isinstance(item, Outputs):
                item = self._host.fetched(self._run_id, item, self.cluster)
            if isinstance(item, (Stream, DisplayData, Outputs, Error, Done)):
                self._shown = True
            return item

    def _from_outside(self, item: object) -> bool:
        """A rank interrupted, or a pod that failed, while this kernel stopped nothing, in a Job Kueue manages (it
        stops only those: others' failures are not delayed): asked about once."""
        labels = (self.job.owner.get("metadata") or {}).get("labels") or {}
        if self._interrupting or self._asked_why or QUEUE_NAME_LABEL not in labels:
            return False
        return ((isinstance(item, Error) and item.ename == "KeyboardInterrupt")
                or (isinstance(item, Done) and item.status == "interrupted")
                or (isinstance(item, PodEnded) and item.state.kind == FAILED))

    def _kueue_stopped(self) -> bool:
        """Whether Kueue stopped the Job: then the run ends saying so, as its first rank's error."""
        self._asked_why = True
        state = kueue_stop(self.pods, self.job, self._nodes.followers.values(), self._ranks.nodes)
        if state is None:
            return False
        self._end_stopped(dataclasses.replace(state, text=state.text + NOT_RERUN))
        return True

    def _end_stopped(self, state: PodState) -> None:
        diagnostics = "\n".join(d for f in self._nodes.followers.values() for d in f.diagnostics)
        self._backlog.end(*[dataclasses.replace(e, rank=0) if isinstance(e, Error) else e
                            for e in failure_events(state, None, diagnostics)])

    def _queue_event(self) -> Queued | None:
        ticket, gated = self._ticket, self._gated
        if ticket is not None and not gated:
            self._leave_queue()
        return self._line.said(ticket, gated)

    def _leave_queue(self) -> None:
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._host.leave(ticket)

    def _pod_ended(self, index: int, ended: PodEnded) -> None:
        state = ended.state
        diagnostics = "\n".join(self._nodes.followers[index].diagnostics)
        if state.kind == FAILED and state.elsewhere and not self._shown and not self._retried:
            self._relaunch(index, ended, diagnostics)
            return
        if state.kind == FAILED:
            # the first failed pod ends the run: its reason, as the first rank of that pod's error
            self._backlog.end(*pod_failure(index, ended, diagnostics, self._ranks))
            return
        self._codes.append(state.exit_code or 0)
        if len(self._nodes.ended) == self._ranks.nodes:
            failed = [code for code in self._codes if code]
            self._backlog.end(RunnerExit(failed[0] if failed else 0, diagnostics))

    def _relaunch(self, index: int, ended: PodEnded, diagnostics: str) -> None:
        """Delete the Job (its pods, Secret and Service go with it) and launch the run once more, on none of
        the first Job's clusters; when that is refused or nothing fits, the first failure and why."""
        self._retried = True
        first, state = self.job, ended.state
        self._nodes.stop()
        self.pods.delete_job(first.name, grace=0)
        self._codes.clear()
        order = dataclasses.replace(self._order, run_id=f"{self._order.run_id}-r")
        try:
            self.job = self._host.launch(order, frozenset(first.clusters or (first.ctx.cluster,)))
        except Exception as exc:  # noqa: BLE001 - no other cluster takes it: report the first failure and why
            text = f"{state.text}, before the cell started; the Job was not moved to another cluster: {exc}"
            self._backlog.end(*pod_failure(index, ended, diagnostics, self._ranks, text))
            return
        self._order = order
        self._leave_queue()
        self._ticket = self.job.ticket
        self._nodes = JobPods(self.pods, order, self._ranks, self.job, self._watch_seconds)
        self._backlog.add(Relaunched(
            f"node {index}: {state.elsewhere} before the cell started; deleted Job {first.name} (its pods, "
            f"Service and Secret) and retrying the run once on {self.job.ctx.cluster} as Job {self.job.name}"))

    def interrupt(self) -> None:
        """Delete the Job with a grace period: each runner gets SIGTERM and interrupts its ranks' cells."""
        self._interrupting = True
        self.pods.delete_job(self.job.name, grace=10)

    def kill(self) -> None:
        """Delete the Job and its pods at once."""
        self._interrupting = True
        self._nodes.stop()
        self.pods.delete_job(self.job.name, grace=0)

    def release(self, grace: float) -> int | None:
        """Stop following and delete the Job (its pods, Secret and Service go with it) and stored objects."""
        if self._released:
            return None
        self._released = True
        self._leave_queue()
        self._nodes.stop()
        try:
            self.pods.delete_job(self.job.name, grace=0 if self._backlog.over else max(0, int(grace)))
        finally:
            self._host.released(self._run_id)
        failed = [code for code in self._codes if code]
        return failed[0] if failed else (0 if self._backlog.over else None)
