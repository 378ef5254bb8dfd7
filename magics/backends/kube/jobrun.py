"""A distributed run (``--nodes N``) in the pods of one Indexed Job, followed as the events of its ranks.

Each pod runs the runner as its node's launcher (its group rank is the pod's ``JOB_COMPLETION_INDEX``); its
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
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ....liqo_peering.rankjob import INDEX_LABEL
from ....liqo_peering.specs import runner_selector
from ...runner.frames import DisplayData, Done, Error, Outputs, Stream
from ..base import Ranks, Relaunched, RunEvent, RunnerExit
from .explain import FAILED, PodState
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

    def launch_job(self, order: PodOrder, ranks: Ranks, avoid: frozenset[str] = frozenset()) -> LaunchedJob:
        """Place ``order``'s Job (on none of the ``avoid`` cluster ids) and create it with its Secret and
        Service; raises when nothing fits, or, for a retry, when the cell is pinned or queueing is on."""
        ...


class KubeJobRun:
    """One bundle as the ranks of an Indexed Job's pods."""

    def __init__(self, launcher: JobLauncher, order: PodOrder, ranks: Ranks, watch_seconds: int,
                 cleanup: Callable[[], None] | None = None, fetch: Callable[[Outputs], Outputs] | None = None) -> None:
        self.pods = launcher.pods
        self._launcher = launcher
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
        self._retried = False
        self._shown = False
        """Whether a rank has shown anything of the cell (output, outputs, an error, its end): a run that
        has is never launched again (its cell would run twice)."""
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
                if isinstance(item, (Stream, DisplayData, Outputs, Error, Done)):
                    self._shown = True
                return item
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(POLL, remaining))

    def _pod_ended(self, index: int, ended: PodEnded) -> RunEvent | None:
        self._ended.add(index)
        state = ended.state
        diagnostics = "\n".join(self._followers[index].diagnostics)
        if state.kind == FAILED and state.elsewhere and not self._shown and not self._retried:
            return self._relaunch(index, state, diagnostics)
        if state.kind == FAILED:
            # the first failed pod ends the run: its reason, as the first rank of that pod's error
            return self._fail(index, state, state.text, diagnostics)
        self._codes.append(state.exit_code or 0)
        if len(self._ended) == self._ranks.nodes:
            self._over = True
            failed = [code for code in self._codes if code]
            return RunnerExit(failed[0] if failed else 0, diagnostics)
        return self.next_event(0)

    def _fail(self, index: int, state: PodState, text: str, diagnostics: str) -> RunEvent | None:
        self._over = True
        rank = index * self._ranks.procs_per_node
        events = failure_events(dataclasses.replace(state, text=f"node {index}: {text}"), state.exit_code, diagnostics)
        self._pending.extend(dataclasses.replace(e, rank=rank) if isinstance(e, Error) else e for e in events)
        return self._pending.popleft()

    def _relaunch(self, index: int, state: PodState, diagnostics: str) -> RunEvent | None:
        """Delete the Job (its pods, Secret and Service go with it) and launch the run once more, on none of
        the first Job's clusters; when that is refused or nothing fits, the first failure and why."""
        self._retried = True
        first = self.job
        self._stop_following()
        self.pods.delete_job(first.name, grace=0)
        self._followers.clear()
        self._ended.clear()
        self._codes.clear()
        self._listed = 0.0
        order = dataclasses.replace(self._order, run_id=f"{self._order.run_id}-r")
        try:
            self.job = self._launcher.launch_job(order, self._ranks, frozenset(first.clusters or (first.ctx.cluster,)))
        except Exception as exc:  # noqa: BLE001 - no other cluster takes it: report the first failure and why
            text = f"{state.text}, before the cell started; the Job was not moved to another cluster: {exc}"
            return self._fail(index, state, text, diagnostics)
        self._order = order
        return Relaunched(
            f"node {index}: {state.elsewhere} before the cell started; deleted Job {first.name} (its pods, "
            f"Service and Secret) and retrying the run once on {self.job.ctx.cluster} as Job {self.job.name}")

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
