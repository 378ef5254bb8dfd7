"""A distributed run (``--nodes N``) in the pods of one Indexed Job, followed as the events of its ranks.

Each pod runs the runner as its node's launcher (its group rank is the pod's ``JOB_COMPLETION_INDEX``); its
log is read by the same :class:`~.follow.PodFollower` as a single cell's, told the run's world size so the
frames of every rank of that pod are accepted. :class:`~...ranked.RankedRun` turns the merged events into one
run. A pod that fails (unschedulable, image pull, lost node) ends the run with the reason, naming the first
rank of that pod; every way out deletes the Job with ``propagationPolicy: Background``, which takes its pods,
Secret and Service.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ....liqo_peering.rankjob import INDEX_LABEL
from ....liqo_peering.specs import runner_selector
from ...runner.frames import Error, Outputs
from ..base import Ranks, RunEvent, RunnerExit
from .explain import FAILED
from .follow import PodEnded, PodFollower
from .pods import PodApi
from .run import LaunchedJob, PodOrder, failure_events

LIST_EVERY = 0.5
"""Seconds between listings of the Job's pods until all of them exist (the Job controller makes them)."""
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
        self._listed = 0.0
        self._over = False
        self._released = False
        self._since = time.monotonic()

    @property
    def cluster(self) -> str:
        """The cluster whose trust decides the run's outputs (see :attr:`LaunchedJob.outputs_from`)."""
        return self.job.outputs_from or self.job.ctx.cluster

    def route_cancel(self, cancel: Callable[[], None]) -> None:
        """A backend's run gets no cancel requests from outside the engine."""

    def progress(self) -> str:
        started = len(self._followers)
        return (f"Job {self.job.name} on {self.cluster}: {started} of {self._ranks.nodes} pod(s) created, "
                f"{time.monotonic() - self._since:.0f} s")

    def _discover(self) -> None:
        """Follow the Job's pods as the Job controller creates them (one follower per index), each until its
        container ends: a pod's launcher sends one ``done`` per rank, and a one-shot follower stops at the first."""
        if len(self._followers) >= self._ranks.nodes or time.monotonic() - self._listed < LIST_EVERY:
            return
        self._listed = time.monotonic()
        for pod in self.pods.list_pods(runner_selector(run_id=self._order.run_id)):
            index = pod_index(pod, self._ranks.nodes)
            if index is None or index in self._followers:
                continue
            self._followers[index] = PodFollower(
                self.pods, pod, self._order.nonce, self.job.ctx, one_shot=False, watch_seconds=self._watch_seconds,
                run_id=self._order.bundle_run, ranks=self._ranks.world_size)

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
