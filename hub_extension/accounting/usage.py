"""What one offloaded pod cost, read from the pod itself when its run ends. Pure: no I/O here.

Runner pods are deleted right after their run, so the watcher sees either a terminal phase (MODIFIED to
Succeeded/Failed) or only the DELETED event; both carry the last state of the pod. The record is keyed
by the pod's uid, which is what makes recording it twice harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.inventory import pod_gpus
from gpu_offload.liqo_peering.timestamps import parse_time

from ..config import USER_NAMESPACE_LABEL

log = logging.getLogger("gpu_offload.hub")
_TERMINAL = {"Succeeded", "Failed"}


@dataclass(frozen=True)
class MeteredRun:
    """One finished offloaded run and the GPU time it held."""

    pod_uid: str
    namespace: str
    pod: str
    user: str
    cluster_id: str
    node: str
    gpus: int
    started: datetime
    ended: datetime
    phase: str
    """Succeeded, Failed, or Deleted (removed before it finished)."""
    price_per_gpu_hour: float | None = None
    """What one GPU-hour of this run cost (cost / GPU-hours when the price changed during it; ``cost.py``)."""
    cost: float | None = None
    """What the run cost at the prices in force while it ran; None: unpriced (or recorded before prices were)."""
    preempted: bool = False
    """Kueue stopped it to make room for a higher-priority run (its pod's ``TerminationTarget`` condition)."""

    @property
    def gpu_seconds(self) -> float:
        """GPUs times wall seconds between start and end (never negative)."""
        return self.gpus * max(0.0, (self.ended - self.started).total_seconds())


def _container_times(status: Mapping[str, Any]) -> tuple[list[datetime], list[datetime]]:
    starts: list[datetime] = []
    ends: list[datetime] = []
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        for key in ("running", "terminated"):
            started = parse_time((state.get(key) or {}).get("startedAt"))
            if started:
                starts.append(started)
        finished = parse_time((state.get("terminated") or {}).get("finishedAt"))
        if finished:
            ends.append(finished)
    return starts, ends


PREEMPTED_REASON = "WorkloadEvictedDueToPreempted"
"""The reason of the ``TerminationTarget`` condition Kueue's pod integration sets on a pod it stops because
its Workload was preempted (jobframework: ``WorkloadEvicted`` + ``DueTo`` + the eviction's reason)."""


def preempted(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue stopped the pod to make room for a higher priority (its status, which only the API
    server's status writers set, not the pod's creator)."""
    return any(c.get("type") == "TerminationTarget" and c.get("reason") == PREEMPTED_REASON
               for c in (pod.get("status") or {}).get("conditions") or [])


def ended_deleting(pod: Mapping[str, Any], now: datetime) -> bool:
    """Whether a pod being deleted has stopped: no container runs any more, or its grace period is over
    (``deletionTimestamp`` is when it ends; the kubelet of a lost node never reports)."""
    deleting = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deleting is None:
        return False
    running = [cs for cs in (pod.get("status") or {}).get("containerStatuses") or [] if (cs.get("state") or {}).get("running")]
    return not running or now >= deleting


def holds_meter(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries the meter's finalizer."""
    return L.METERED_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


def pod_user(pod: Mapping[str, Any]) -> str:
    """The hub user a runner pod belongs to: the raw name from its annotation, else its label."""
    meta = pod.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(L.USER) or (meta.get("labels") or {}).get(L.USER) or "")


def namespace_user(namespace: Mapping[str, Any] | None) -> str | None:
    """The user a user namespace belongs to (the spawner hook's annotation), ``""`` for a user namespace made
    before the hook wrote it, None for any other namespace (or none)."""
    meta = (namespace or {}).get("metadata") or {}
    if (meta.get("labels") or {}).get(USER_NAMESPACE_LABEL) != "true":
        return None
    return str((meta.get("annotations") or {}).get(L.USER) or "")


def billed_user(pod: Mapping[str, Any], namespace: Mapping[str, Any] | None) -> str:
    """Whom a pod's GPU time is billed to: the owner of the user namespace it ran in, whatever the pod says.

    The pod's own annotation is written by whoever created the pod, so in a user namespace it is only
    compared, and a disagreement is logged and ignored. Outside user namespaces (Metaflow steps in a shared
    namespace) the annotation is all there is: it trusts everyone who may create pods in that namespace.
    """
    claimed = pod_user(pod)
    owner = namespace_user(namespace)
    meta = pod.get("metadata") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    if owner is None:
        return claimed
    if not owner:
        log.warning("%s: its user namespace has no %s annotation (made before this version); billed to nobody "
                    "until the user's server is restarted by the hub", where, L.USER)
    elif claimed and claimed != owner:
        log.warning("%s claims user %r but runs in %r's namespace: billed to %r, the claim is ignored", where,
                    claimed, owner, owner)
    return owner


def finished_run(
    pod: Mapping[str, Any], event_type: str, node_clusters: Mapping[str, str], now: datetime
) -> MeteredRun | None:
    """The record of a run that just ended, or None when the pod is still running or never held a GPU.

    ``node_clusters`` maps virtual node names to cluster ids (from the inventory); a pod that ran
    elsewhere is not an offloaded run. The end is the last container's finish time, else the pod's
    deletion time when it is being deleted (held by the meter's finalizer, perhaps while the hub was
    down), else ``now`` (the pod was deleted while running, which is when its GPUs were released).
    """
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "")
    deleting = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    if phase not in _TERMINAL and event_type != "DELETED" and not (deleting and ended_deleting(pod, now)):
        return None
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    gpus = pod_gpus(pod)
    if not node or node not in node_clusters or gpus < 1:
        return None
    starts, ends = _container_times(status)
    started = parse_time(status.get("startTime")) or (min(starts) if starts else None)
    if started is None:
        return None  # never started: it held no GPU time
    ended = max(ends) if ends else (deleting or now)
    meta = pod.get("metadata") or {}
    return MeteredRun(
        pod_uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
        namespace=str(meta.get("namespace") or ""),
        pod=str(meta.get("name") or ""),
        user=pod_user(pod),
        cluster_id=node_clusters[node],
        node=node,
        gpus=gpus,
        started=started,
        ended=max(ended, started),
        phase=phase if phase in _TERMINAL else "Deleted",
        preempted=preempted(pod),
    )
