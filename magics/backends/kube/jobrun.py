"""A distributed run (``--nodes N``) in the pods of one Indexed Job, followed as the events of its ranks.

The Job controller creates the pods: the run learns of them through the project's list-then-watch loop
(``watching.ListWatch`` on the run's label selector), until all N are known. Each pod runs the runner as its
node's launcher (its group rank is the pod's ``JOB_COMPLETION_INDEX``); its log is read by the same
:class:`~.follow.PodFollower` as a single cell's, told the run's world size so the frames of every rank of
that pod are accepted. :class:`~...ranked.RankedRun` turns the merged events into one
run. A pod that fails (unschedulable, image pull, lost node) ends the run with the reason, naming the first
rank of that pod; every way out deletes the Job with ``propagationPolicy: Background``, which takes its pods,
Secret and Service.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ....liqo_peering.errors import APIForbidden, APINotFound, APIUnauthorized
from ....liqo_peering.rankjob import INDEX_LABEL
from ....liqo_peering.specs import runner_selector
from ....liqo_peering.watching import Event, ListResult, ListWatch
from ...runner.frames import Error, Outputs
from ..base import Ranks, RunEvent, RunnerExit
from .explain import FAILED
from .follow import PodEnded, PodFollower
from .pods import PodApi
from .run import LaunchedJob, PodOrder, failure_events

LASTING = (APIUnauthorized, APIForbidden, APINotFound)
"""Failures of the pods' list or watch that trying again does not mend (the loop retries the others)."""
POLL = 0.05
"""Longest pause between looks at the followers' queues."""


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

    def event(self, event: Event) -> None:
        self.error = None
        if event.get("type") in ("ADDED", "MODIFIED") and isinstance(event.get("object"), dict):
            self.seen.put(event["object"])

    def failed(self, exc: Exception) -> None:
        self.error = exc


class JobLauncher(Protocol):
    pods: PodApi

    def launch_job(self, order: PodOrder, ranks: Ranks) -> LaunchedJob:
        ...


class KubeJobRun:
    """One bundle as the ranks of an Indexed Job's pods."""

    def __init__(self, launcher: JobLauncher, order: PodOrder, ranks: Ranks, watch_seconds: int,
                 cleanup: Callable[[], None] | None = None, fetch: Callable[[Outputs], Outputs] | None = None) -> None:
        self.pods = launcher.pods
        self._order = order
        self._ranks = ranks
        self._watch_seconds = watch_seconds
        self.job = launcher.launch_job(order, ranks)
        self._cleanup = cleanup
        self._fetch = fetch
        self._followers: dict[int, PodFollower] = {}
        self._ended: set[int] = set()
        self._codes: list[int] = []
        self._pending: deque[RunEvent] = deque()
        self._found = RunPods()
        self._watch: ListWatch | None = self._watch_pods()
        self._over = False
        self._released = False
        self._since = time.monotonic()

    @property
    def cluster(self) -> str:
        return self.job.ctx.cluster

    def route_cancel(self, cancel: Callable[[], None]) -> None:
        """A backend's run gets no cancel requests from outside the engine."""

    def progress(self) -> str:
        started = len(self._followers)
        error = self._found.error
        return (f"Job {self.job.name} on {self.cluster}: {started} of {self._ranks.nodes} pod(s) created, "
                f"{time.monotonic() - self._since:.0f} s" + (f" (watching its pods failed: {error})" if error else ""))

    def _watch_pods(self) -> ListWatch:
        collection = self.pods.pods_matching(runner_selector(run_id=self._order.run_id))
        return ListWatch(f"pods of Job {self.job.name}", collection.list, collection.watch, self._found,
                         watch_seconds=self._watch_seconds).start()

    def _discover(self) -> None:
        """Follow the Job's pods as the watch reports them (one follower per index), each until its container
        ends: a pod's launcher sends one ``done`` per rank, and a one-shot follower stops at the first. The
        watch ends once every index has its follower."""
        if self._watch is None:
            return
        if isinstance(self._found.error, LASTING):
            raise self._found.error
        while len(self._followers) < self._ranks.nodes:
            try:
                pod = self._found.seen.get_nowait()
            except queue.Empty:
                return
            index = pod_index(pod, self._ranks.nodes)
            if index is None or index in self._followers:
                continue
            self._followers[index] = PodFollower(
                self.pods, pod, self._order.nonce, self.job.ctx, one_shot=False, watch_seconds=self._watch_seconds,
                run_id=self._order.bundle_run, ranks=self._ranks.world_size)
        self._stop_watching()

    def _stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.close(timeout=0)  # the thread ends on its own once its request is shut
            self._watch = None

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.magics.backends.base.Run.next_event`."""
        deadline = time.monotonic() + timeout
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._over:
                return None
            self._discover()
            for index, follower in list(self._followers.items()):
                if index in self._ended:
                    continue
                item = follower.next(0)
                if item is None:
                    continue
                if isinstance(item, PodEnded):
                    return self._pod_ended(index, item)
                if isinstance(item, Outputs) and self._fetch is not None:
                    item = self._fetch(item)
                return item
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(POLL, remaining))

    def _pod_ended(self, index: int, ended: PodEnded) -> RunEvent | None:
        self._ended.add(index)
        state = ended.state
        diagnostics = "\n".join(self._followers[index].diagnostics)
        if state.kind == FAILED:
            # the first failed pod ends the run: its reason, as the first rank of that pod's error
            self._over = True
            rank = index * self._ranks.procs_per_node
            events = failure_events(dataclasses.replace(state, text=f"node {index}: {state.text}"), state.exit_code,
                                    diagnostics)
            self._pending.extend(dataclasses.replace(e, rank=rank) if isinstance(e, Error) else e for e in events)
            return self._pending.popleft()
        self._codes.append(state.exit_code or 0)
        if len(self._ended) == self._ranks.nodes:
            self._over = True
            failed = [code for code in self._codes if code]
            return RunnerExit(failed[0] if failed else 0, diagnostics)
        return self.next_event(0)

    def interrupt(self) -> None:
        """Delete the Job with a grace period: each runner gets SIGTERM and interrupts its ranks' cells."""
        self.pods.delete_job(self.job.name, grace=10)

    def kill(self) -> None:
        """Delete the Job and its pods at once."""
        self._stop_following()
        self.pods.delete_job(self.job.name, grace=0)

    def _stop_following(self) -> None:
        self._stop_watching()
        for follower in self._followers.values():
            follower.stop()

    def release(self, grace: float) -> int | None:
        """Stop following and delete the Job (its pods, Secret and Service go with it) and stored objects."""
        if self._released:
            return None
        self._released = True
        self._stop_following()
        try:
            self.pods.delete_job(self.job.name, grace=0 if self._over else max(0, int(grace)))
        finally:
            if self._cleanup is not None:
                self._cleanup()
        failed = [code for code in self._codes if code]
        return failed[0] if failed else (0 if self._over else None)
