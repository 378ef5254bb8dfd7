"""What a runner pod's status means, in words a notebook user understands (pure functions).

The follower asks :func:`pod_state` after every pod event; a ``failed`` state ends the run with its
sentence, a ``waiting`` one is shown as progress while the cell has printed nothing yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ....liqo_peering import environment as E
from ....liqo_peering import labels as L
from ....liqo_peering.kueue_stop import preempted_by
from ....liqo_peering.shares import ClusterShare
from ....liqo_peering.timestamps import parse_time
from ....liqo_peering.untrusted_text import shown
from ....liqo_peering.wording import duration

MEMORY_ENV = E.MEMORY.name
"""Memory request and limit of runner pods (e.g. ``32Gi``), read when a cell is submitted."""
WAITING, RUNNING, FINISHED, FAILED = "waiting", "running", "finished", "failed"
# Waiting reasons after which the kubelet will not succeed by itself: the pod spec or the cluster must change.
_HOPELESS = ("ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError")
KUEUE_STOPPED = "TerminationTarget"
PODS_READY_TIMEOUT = "PodsReadyTimeout"
"""The eviction reason of Kueue's ``waitForPodsReady`` (on by default since Kueue 0.19, 30 minutes)."""
"""The pod condition Kueue writes on a pod it stops (reason ``WorkloadEvictedDueTo<Evicted's reason>``, message
the eviction's), before it deletes the pod; it records the same message in a ``Stopped`` event on the pod."""
PREEMPTED = "Preempted"


@dataclass(frozen=True)
class FrontWords:
    """How the sentences name the run, by the front end that started it: the one place these words differ."""

    again: str
    """What to do to try once more, e.g. ``Run the cell again``."""
    kept: str
    """What a run that ended early leaves the user."""
    such: str
    """The run as a kind, e.g. ``such a cell``."""
    shown_in: str
    """Where its output appears."""


CELL = FrontWords("Run the cell again", "output so far is kept, no variable was copied back", "such a cell",
                  "the notebook")
"""A cell's run (the magic, the panel)."""
COMMAND = FrontWords("Run the command again", "its output so far is shown above", "such a run", "the terminal")
"""A ``gpu-offload run`` script's run."""


def front_words(cli: bool) -> FrontWords:
    """The words of a run of ``gpu-offload run`` (``cli``) or of a cell."""
    return COMMAND if cli else CELL


@dataclass(frozen=True)
class PodContext:
    """What the sentences name besides the pod: where it was sent and what it asked for."""

    cluster: str
    gpus: int
    image: str
    memory: str | None = None
    model: str | None = None
    """The GPU model placement chose (None: the node names none)."""
    share: str = ""
    """Part of a GPU held, how the donor lends it and the isolation it gives (``ResourceAsk.describe``)."""
    shares: tuple[ClusterShare, ...] = ()
    """Part of a GPU: per cluster the pod may land on, what it holds there and its isolation warning."""
    notice: str = ""
    """Part of a GPU on a donor that does not isolate its memory: the warning, said with where the pod runs."""
    words: FrontWords = CELL
    """How the sentences name the run: a cell's, or a ``gpu-offload run`` command's."""

    def on_cluster(self) -> PodContext:
        """This context with the share and warning of ``cluster`` once it is known (placed, or admitted by
        Kueue); unchanged while no share is known for it."""
        mine = next((s for s in self.shares if s.cluster == self.cluster), None)
        return self if mine is None else dataclasses.replace(self, share=mine.text, notice=mine.notice)


@dataclass(frozen=True)
class PodState:
    """One reading of a runner pod."""

    kind: str
    """``waiting``, ``running``, ``finished`` or ``failed``."""
    text: str = ""
    """Progress (waiting) or the explanation (failed)."""
    reason: str = ""
    """Kubernetes' reason, e.g. ``OOMKilled``; used as the error's name."""
    exit_code: int | None = None
    lost: bool = False
    """The virtual node (the peering) was lost: the run may be retried elsewhere if it had not started."""
    summary: str = ""
    """What happened in a few words, for a sentence about something else (a session whose pod ended)."""
    elsewhere: str = ""
    """Set when another cluster may succeed (node lost, or this one cannot schedule the pod): the clause
    the retry notice starts with. Empty for failures that would repeat anywhere."""


MAX_SAID = 1000
"""Characters of a status message shown at most (a scheduler's over many nodes runs to a few hundred)."""


def _said(value: object, otherwise: str = "") -> str:
    """A message the pod's status or a Kueue stop carries, as shown: Liqo reflects a donor's pod status onto the
    origin's pod, and anyone who may write events in the namespace writes a stop event's words."""
    return shown(value or otherwise, MAX_SAID)


def _runner_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _gpus(n: int) -> str:
    return "no GPU" if not n else f"{n} GPU" + ("" if n == 1 else "s")


def _terminated(pod: Mapping[str, Any], ctx: PodContext) -> PodState | None:
    state = _runner_status(pod).get("state") or {}
    done = state.get("terminated")
    if not done:
        return None
    code = int(done.get("exitCode") or 0)
    reason = str(done.get("reason") or "")
    if reason == "OOMKilled":
        limit = f" (memory limit {ctx.memory})" if ctx.memory else ""
        return PodState(FAILED, (
            f"the cell ran out of memory on {ctx.cluster} with {_gpus(ctx.gpus)}{limit}: the runner was killed "
            f"(OOMKilled, exit code {code}); output so far is kept, no variable was copied back. Ask for more "
            f"memory with `%env {MEMORY_ENV}=32Gi` before the next cell, or use less (smaller batches, "
            "del large arrays)"), reason, code)
    return PodState(FINISHED, "", reason, code)


def _node_lost(ctx: PodContext, why: str, reason: str) -> PodState:
    lost = f"the virtual node of {ctx.cluster} was lost ({why})"
    return PodState(FAILED, lost, reason, lost=True, elsewhere=lost, summary=f"lost with the virtual node of {ctx.cluster}")


def _evicted_from_lost_node(pod: Mapping[str, Any], ctx: PodContext) -> PodState | None:
    """Kubernetes' taint eviction took the pod: its node stopped answering (Ready Unknown or False, the node
    controller's NoExecute taint) for longer than the pod tolerates. The pod stays Running and Terminating while
    nobody on that node can confirm it ended, so this condition is the only sign the run is lost."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type") == L.DISRUPTION_TARGET and cond.get("status") == "True"
                and cond.get("reason") == L.TAINT_EVICTION):
            node = (pod.get("spec") or {}).get("nodeName") or "its node"
            return _node_lost(ctx, f"{node} stopped answering and Kubernetes evicted the pod: "
                                   f"{_said(cond.get('message'), L.TAINT_EVICTION)}", L.TAINT_EVICTION)
    return None


def _evicted_through_api(pod: Mapping[str, Any], ctx: PodContext) -> PodState | None:
    """The pod was evicted through the Eviction API (``kubectl drain`` of its node, or another tool that evicts):
    the API server marked it and deleted it with its grace period, so its runner got SIGTERM."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type") == L.DISRUPTION_TARGET and cond.get("status") == "True"
                and cond.get("reason") == L.EVICTION_API):
            node = (pod.get("spec") or {}).get("nodeName") or "its node"
            summary = f"evicted from {ctx.cluster} (node {node}) through the Eviction API, as a drain of the node does"
            return PodState(FAILED, f"{summary}; {ctx.words.kept}. {ctx.words.again} (placement avoids a cordoned "
                                    "node)", L.EVICTION_API, summary=summary)
    return None


def _failed_pod(status: Mapping[str, Any], ctx: PodContext) -> PodState | None:
    reason = str(status.get("reason") or "")
    message = _said(status.get("message"))
    if reason == "NodeLost":  # what older node controllers wrote on pods of a lost node
        return _node_lost(ctx, message, reason)
    if reason == "DeadlineExceeded":
        return PodState(FAILED, (
            f"the pod on {ctx.cluster} reached its deadline (--timeout) and Kubernetes stopped it; output so "
            "far is kept. Raise --timeout or make the cell faster"), reason)
    if reason == "Evicted":
        return PodState(FAILED, (
            f"the pod was evicted from {ctx.cluster}: {message}; the donor needed the resources back. Run "
            "the cell again (placement picks a cluster with room)"), reason)
    return None


def _pending(pod: Mapping[str, Any], ctx: PodContext) -> PodState:
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    if reason == "OffloadingBackOff":
        namespace = (pod.get("metadata") or {}).get("namespace")
        return PodState(FAILED, (
            f"namespace {namespace} is not offloaded, so Liqo will not send the pod to {ctx.cluster} "
            f"(OffloadingBackOff: {_said(status.get('message'))}). Ask your JupyterHub admin to offload it, or "
            "create its NamespaceOffloading with `liqoctl offload namespace`"), reason)
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            said = _said(cond.get("message"), "Unschedulable")
            if _kueue_managed(pod):
                # Kueue admitted it against its quota; what the scheduler lacks (a GPU held by a pod Kueue does not
                # count, a node catching up) is Kueue's to judge: waitForPodsReady evicts the pod if it does not
                # start in time, and the run then queues a new pod once (run.py). Failing here would end a cell
                # Kueue would have given another chance.
                return PodState(WAITING, (
                    f"admitted by Kueue to {ctx.cluster}, but no node can take the pod yet (the scheduler says "
                    f"\"{said}\"); if it does not start within Kueue's waitForPodsReady timeout, Kueue evicts it and "
                    "the cell queues again once"), "Unschedulable")
            return PodState(FAILED, (
                f"no node can take the pod for {ctx.cluster} with {_gpus(ctx.gpus)}: the scheduler says "
                f"\"{said}\". Check `gpu-offload clusters`, then ask for fewer "
                "GPUs, another --gpu-model or --cluster"), "Unschedulable",
                elsewhere=f"{ctx.cluster} cannot schedule the pod (the scheduler says \"{said}\")")
    waiting = (_runner_status(pod).get("state") or {}).get("waiting") or {}
    why = str(waiting.get("reason") or "")
    if why in _HOPELESS:
        if "Image" in why:
            text = (f"the image {ctx.image} cannot be pulled on {ctx.cluster} ({why}: {_said(waiting.get('message'))}); "
                    "check its name and tag, or pass another with --image (it needs a Python of the "
                    "kernel's minor version)")
        else:
            text = f"the runner container cannot be created on {ctx.cluster} ({why}: {_said(waiting.get('message'))})"
        return PodState(FAILED, text, why)
    if queued(pod):
        return PodState(WAITING, "waiting for Kueue to admit the pod", "SchedulingGated")
    node = (pod.get("spec") or {}).get("nodeName")
    where = f"on {node} ({ctx.cluster})" if node else f"waiting to be scheduled for {ctx.cluster}"
    return PodState(WAITING, f"pod Pending {where}" + (f": {why}" if why else ""))


def _kueue_managed(pod: Mapping[str, Any]) -> bool:
    """Whether the pod went through Kueue (it names a LocalQueue)."""
    return L.QUEUE_NAME_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


def queued(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still carries Kueue's admission gate (it waits in the queue)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == L.ADMISSION_GATE for g in gates)

def ran_for(started: str | None, stopped: str | None) -> float | None:
    """Seconds between two API timestamps (a container's start and Kueue's stop), None if one is missing."""
    first, last = parse_time(started), parse_time(stopped)
    return (last - first).total_seconds() if first and last else None


def stopped_by_kueue(reason: str, message: str, ran: float | None, ctx: PodContext) -> PodState:
    """A pod Kueue stopped, in words: preempted (``WorkloadEvictedDueToPreempted``, or the eviction message
    Kueue words as "Preempted to accommodate ... due to <why>"), or evicted for another reason (its message).

    ``ran``: seconds the runner had run, None when it never started."""
    message = _said(message)
    after = f" after {duration(ran, 'min')}" if ran is not None else " before it started"
    by = preempted_by(reason, message)
    if by is not None:
        summary = f"preempted{after} {by}"
        return PodState(FAILED, (
            f"{summary}: Kueue gave its {_gpus(ctx.gpus)} on {ctx.cluster} to another run; {ctx.words.kept}. "
            f"{ctx.words.again} to queue it once more, or with --priority of a higher class if you may use one"),
            PREEMPTED, summary=summary)
    cause = _said(reason.removeprefix("WorkloadEvictedDueTo"), "Evicted")
    summary = f"stopped by Kueue{after} ({cause}: {message})"
    # waitForPodsReady evicts a Workload whose pods are not ready in time; Kueue requeues a Job but deletes a
    # plain pod for good, so the run asks for a new pod through the retry every unstarted failure gets
    again = (f"Kueue evicted the pod ({cause}: {message})"
             if cause == PODS_READY_TIMEOUT and ran is None else "")
    return PodState(FAILED, (
        f"{summary} on {ctx.cluster}; {ctx.words.kept}. {ctx.words.again} to queue it once more"), cause,
        summary=summary, elsewhere=again)


def _kueue_stop(pod: Mapping[str, Any], ctx: PodContext) -> PodState | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == KUEUE_STOPPED and cond.get("status") == "True":
            runner = _runner_status(pod).get("state") or {}
            started = (runner.get("running") or runner.get("terminated") or {}).get("startedAt")
            return stopped_by_kueue(str(cond.get("reason") or ""), str(cond.get("message") or ""),
                                    ran_for(started, cond.get("lastTransitionTime")), ctx)
    return None


def placed_text(pod: Mapping[str, Any], ctx: PodContext) -> str:
    """Where a bound pod runs, in one line: pod, virtual node, Liqo cluster, GPUs and model."""
    name = (pod.get("metadata") or {}).get("name", "")
    node = (pod.get("spec") or {}).get("nodeName") or "an unknown node"
    gpus = f"{ctx.gpus} x {ctx.model}" if ctx.model else _gpus(ctx.gpus)
    if ctx.share:
        gpus = f"{ctx.share}, {ctx.model}" if ctx.model else ctx.share
    where = f"running in pod {name} on virtual node {node} (Liqo cluster {ctx.cluster}, {gpus})"
    return f"{where}. {ctx.notice}" if ctx.notice else where


def pod_state(pod: Mapping[str, Any], ctx: PodContext) -> PodState:
    """Read a runner pod: waiting (with progress), running, finished (exit code) or failed (with a sentence)."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    # Kueue marks the pod before deleting it: its runner may still be shutting down, or have exited 0 on SIGTERM
    stopped = _kueue_stop(pod, ctx) or _evicted_from_lost_node(pod, ctx) or _evicted_through_api(pod, ctx)
    if stopped is not None:
        return stopped
    if phase in ("Failed", "Succeeded"):
        failed = _failed_pod(status, ctx) if phase == "Failed" else None
        if failed is not None:
            return failed
    ended = _terminated(pod, ctx)
    if ended is not None:
        return ended
    if phase == "Failed":
        return PodState(FAILED, f"the pod failed on {ctx.cluster}: {shown(status.get('reason'), MAX_SAID)}: "
                                f"{shown(status.get('message'), MAX_SAID)}",
                        str(status.get("reason") or "PodFailed"))
    if phase == "Running" or (_runner_status(pod).get("state") or {}).get("running"):
        return PodState(RUNNING)
    return _pending(pod, ctx)
