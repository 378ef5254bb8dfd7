"""A one-shot cell in a pod, as the engine follows it: frames in, the pod's end explained, cleanup on release.

A virtual node lost before the runner said hello, or a cluster whose scheduler cannot take the pod (the
inventory said it had room, but a neighbour was faster or the pod asks for more memory than its nodes have),
is retried once on another cluster that fits (the user is told); a queued pod Kueue evicted for not starting
in time (``waitForPodsReady`` deletes a plain pod rather than requeueing it) is queued again through the same
single retry. Lost after the hello, the run is reported lost with how much output had arrived.
"""

from __future__ import annotations

import dataclasses
import math
import time

from ....liqo_peering.wording import duration
from ....runner.frames import DisplayData, Done, Hello, Outputs, RunnerWarning, Status, Stream
from ..base import Queued, RunEvent, RunnerExit
from .explain import FAILED, PODS_READY_TIMEOUT, PodState, pod_state
from .follow import PodEnded
from .host import WHY_STOPPED_SECONDS, Backlog, Cordon, Host, InLine, failure_events, follow_pod
from .plan import PodOrder
from .requeue import after_preemption


class KubeRun:
    """One bundle in one pod (two, if the first was lost before starting)."""

    def __init__(self, host: Host, order: PodOrder) -> None:
        self.pods = host.pods
        self._host = host
        self._order = order
        self._run_id = order.run_id
        self.current = follow_pod(host, host.launch(order), order)
        self._backlog = Backlog(self.current.phases)
        self._retried = False
        self._rerun = False
        """Rerun once already after a preemption (:mod:`.requeue`)."""
        self._shown = 0
        self._hello = False
        self._lines = 0
        self._done = False
        self._exit_code: int | None = None
        self._released = False
        self._since = time.monotonic()
        self._waiting = "pod created"
        self._interrupting = False
        self._line = InLine()
        self._cordon = Cordon()

    @property
    def cluster(self) -> str:
        """The cluster of the current pod (the second one after a retry elsewhere)."""
        return self.current.ctx.cluster

    def progress(self) -> str:
        """Phase, cluster and elapsed time, for ``--noblock`` handles."""
        elapsed = time.monotonic() - self._since
        cluster = self.current.ctx.cluster
        ticket = self.current.ticket
        if ticket is not None and not self._backlog.over and self.current.follower.gated:
            return ticket.text()
        if self._backlog.over:
            return f"ended on {cluster} after {elapsed:.0f} s"
        if self._hello:
            return f"Running on {cluster}, {elapsed:.0f} s"
        return f"Pending for {cluster}, {elapsed:.0f} s: {self._waiting}"

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.engine.backends.base.Run.next_event`."""
        if self._backlog.due:
            return self._backlog.take()
        queued = self._queue_event()
        if queued is not None:
            return queued
        moved = self._leave_cordoned()
        if moved is not None:
            return moved
        item = self.current.follower.next(timeout)
        if item is None:
            return None
        if isinstance(item, PodEnded):
            return self._ended_with(item.state)
        if isinstance(item, Hello):
            self._hello = True
        elif isinstance(item, Status) and not self._hello:
            self._waiting = item.state
        elif isinstance(item, Stream):
            self._lines += item.text.count("\n")
            self._shown += 1
        elif isinstance(item, DisplayData):
            self._shown += 1
        elif isinstance(item, Outputs):
            item = self._host.fetched(self._run_id, item, self.cluster)
        elif isinstance(item, Done) and item.status == "interrupted" and not self._interrupting:
            return self._stopped_from_outside(item)
        if isinstance(item, Done):
            self._done = True
        return item

    def _queue_event(self) -> Queued | None:
        return self._line.event(self.current, self._host)

    def _leave_queue(self) -> None:
        self._line.leave(self.current, self._host)

    def _leave_cordoned(self) -> RunEvent | None:
        """A pod that waits on a cordoned node before its runner started moves to another donor with room, as the
        one retry elsewhere (nothing ran, nothing is lost); else the cell says it waits there."""
        if self._retried or self._hello:
            return None
        step = self._cordon.step(self.current, self._order, self._host)
        if step is None:
            return None
        if not step.move:
            return RunnerWarning(-1, step.text)
        first = self.current
        retry = dataclasses.replace(self._order, run_id=f"{self._order.run_id}-r")
        try:  # the new pod first: when nothing else takes it after all, the first one keeps waiting
            launched = self._host.launch(retry, frozenset({first.ctx.cluster}))
        except Exception as exc:  # noqa: BLE001 - pinned, queued, or the room went meanwhile: it waits there
            self._cordon.said = True
            return RunnerWarning(-1, f"{step.why}; the cell's pod could not move ({exc}): it waits there; if the "
                                     "drain evicts it before it starts, run the cell again")
        self._retried = True
        self._leave_queue()
        first.follower.stop()
        self.pods.delete_pod(first.name, grace=0)
        self.current = follow_pod(self._host, launched, retry)
        return RunnerWarning(-1, f"{step.why} before the cell started; moved its pod to {self.current.ctx.cluster}")

    def _stopped_from_outside(self, done: Done) -> RunEvent | None:
        """The runner got SIGTERM that this kernel did not send (eviction, Kueue's preemption, node drain,
        deadline): say why."""
        deadline = time.monotonic() + WHY_STOPPED_SECONDS
        while time.monotonic() < deadline:
            pod = self.pods.read_pod(self.current.name)
            # gone already (Kueue deletes a pod it preempts): its events say who stopped it
            state = pod_state(pod, self.current.ctx) if pod is not None else self.current.follower.gone()
            if state.kind == FAILED:
                return self._ended_with(state)
            time.sleep(0.2)
        return done

    def _ended_with(self, state: PodState) -> RunEvent | None:
        self._exit_code = state.exit_code
        diagnostics = "\n".join(self.current.follower.diagnostics)
        preempted = after_preemption(state, self._shown, self._order.placement.rerun_on_preemption, self._rerun,
                                     self._done, self.current.ctx.words)
        if preempted is not None and preempted.rerun:
            return self._requeue(preempted.words)
        if preempted is not None:
            state = dataclasses.replace(state, text=state.text + preempted.words)
        if state.kind == FAILED and state.elsewhere and not self._hello and not self._retried:
            first = self.current
            self._retried = True
            self.pods.delete_pod(first.name, grace=0)
            # a pod Kueue evicted for not starting in time queues again where Kueue picks (Kueue requeues
            # Jobs itself but deletes plain pods); any other goes to another cluster
            avoid = frozenset() if state.reason == PODS_READY_TIMEOUT else frozenset({first.ctx.cluster})
            try:
                retry = dataclasses.replace(self._order, run_id=f"{self._order.run_id}-r")
                self.current = follow_pod(self._host, self._host.launch(retry, avoid), retry)
            except Exception as exc:  # noqa: BLE001 - no second cluster fits: report the first failure and why
                text = f"{state.text}, before the cell started; no other cluster can take it: {exc}"
                return self._finish(*failure_events(dataclasses.replace(state, text=text), None, diagnostics))
            return RunnerWarning(-1, (
                f"{state.elsewhere} before the cell started; retrying once on {self.current.ctx.cluster}"))
        if state.kind == FAILED:
            if state.lost:
                text = (f"{state.text} after the cell had started: {self._lines} line(s) of output arrived "
                        "(shown above) and the rest of the run was lost; no variable was copied back. Run the "
                        "cell again")
                state = dataclasses.replace(state, text=text, reason="VirtualNodeLost")
            return self._finish(*failure_events(state, state.exit_code, diagnostics))
        return self._finish(RunnerExit(state.exit_code, diagnostics))

    def _requeue(self, words: str) -> RunEvent | None:
        """Queue the run again after a preemption (the first pod is gone or going), once."""
        self._rerun = True
        self._leave_queue()
        self.current.follower.stop()
        self.pods.delete_pod(self.current.name, grace=0)
        retry = dataclasses.replace(self._order, run_id=f"{self._order.run_id}-p")
        try:
            self.current = follow_pod(self._host, self._host.launch(retry), retry)
        except Exception as exc:  # noqa: BLE001 - it cannot be queued again: the preemption ends the run
            return self._finish(RunnerExit(None, f"{words}; but it could not be queued again: {exc}"))
        self._hello = False
        return RunnerWarning(-1, words)

    def _finish(self, *events: RunEvent) -> RunEvent | None:
        self._backlog.end(*events)
        return self._backlog.take()

    def interrupt(self) -> None:
        """Delete the pod with a grace period: the runner gets SIGTERM and interrupts the cell. A pod still in
        Kueue's queue is withdrawn at once: deleting it removes its Workload (the pod owns it), nothing ran."""
        self._interrupting = True
        ticket = self.current.ticket
        if ticket is not None and self.current.follower.gated and not self._backlog.over:
            self.current.follower.stop()
            self.pods.delete_pod(self.current.name, grace=0)
            self._leave_queue()
            self._backlog.end(Queued(f"withdrawn from the queue (LocalQueue {ticket.queue}) after "
                                     f"{duration(time.monotonic() - ticket.since)}: nothing ran", waiting=False),
                              Done(-1, "interrupted", 0.0))
            return
        self.pods.delete_pod(self.current.name, grace=10)

    def kill(self) -> None:
        """Delete the pod at once."""
        self.current.follower.stop()
        self.pods.delete_pod(self.current.name, grace=0)

    def release(self, grace: float) -> int | None:
        """Stop following and delete the pod (its Secret goes with it) and the run's stored objects.

        A runner still in its cell (released before its ``done`` frame) gets SIGTERM, which interrupts the
        cell, and ``grace`` seconds (the pod's deletion grace period) before it is killed; a runner that is
        done has nothing left to do and goes at once. Returns the runner's exit code when the pod's end was
        seen.
        """
        if self._released:
            return self._exit_code
        self._released = True
        self._leave_queue()
        self.current.follower.stop()
        finished = self._done or self._backlog.over
        try:
            self.pods.delete_pod(self.current.name, grace=0 if finished else max(0, math.ceil(grace)))
        finally:
            self._host.released(self._run_id)
        return self._exit_code

