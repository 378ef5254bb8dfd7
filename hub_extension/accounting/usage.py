"""What one offloaded pod cost, from the pod and what the meter observed of it when its run ends. Pure: no
I/O here.

Runner pods are deleted right after their run, so the watcher sees either a terminal phase (MODIFIED to
Succeeded/Failed) or only the DELETED event; both carry the last state of the pod. The record is keyed
by the pod's uid, which is what makes recording it twice harmless. How long it ran is what the origin
saw (its creation, when the meter first saw it Running, its deletion, when the meter saw it end): the
status times are the donor's, copied verbatim by Liqo, so they decide nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.inventory import FINISHED_PHASES, pod_devices, pod_gpus
from gpu_offload.liqo_peering.sharing import GpuOffer, held_share
from gpu_offload.liqo_peering.timestamps import parse_time

from ..config import USER_NAMESPACE_LABEL

log = logging.getLogger("gpu_offload.hub")


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
    share: float | None = None
    """Part of one GPU held (time-slicing or MPS shares, a MIG profile, an isolator's memory, docs/sharing.md);
    None: ``gpus`` whole GPUs."""

    @property
    def held(self) -> float:
        """The GPUs the run is charged for: its part of one GPU, or its whole GPUs."""
        return self.share if self.share is not None else float(self.gpus)

    @property
    def gpu_seconds(self) -> float:
        """GPUs held times wall seconds between start and end (never negative)."""
        return self.held * max(0.0, (self.ended - self.started).total_seconds())


def donor_says_started(status: Mapping[str, Any]) -> bool:
    """Whether the pod's status (the donor's, copied by Liqo) says it ever started: used only to tell a run
    from a pod that never left Pending, never for how long it ran."""
    if status.get("startTime"):
        return True
    return any((cs.get("state") or {}).get(key) for cs in status.get("containerStatuses") or []
               for key in ("running", "terminated"))


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


def seen_running(pod: Mapping[str, Any], event_type: str, now: datetime) -> bool:
    """Whether this sighting of ``pod`` is the meter seeing it run: Running, not its deletion's event, and not
    already stopped in a deletion. A pod deleted while the meter was down and held by its finalizer was never
    seen running: taking ``now`` as its start would start its run after its end (a run of no time, priced at
    today's price); it is metered from its creation to its deletion instead (:func:`finished_run`)."""
    return (event_type != "DELETED" and (pod.get("status") or {}).get("phase") == "Running"
            and not ended_deleting(pod, now))


def metered(pod: Mapping[str, Any], virtual_nodes: Collection[str]) -> bool:
    """Whether the meter follows ``pod``: bound to a virtual node (whoever made it and whatever its labels),
    or the project's own (labelled, or holding the meter's finalizer, which must be released even for a pod
    that never got a node)."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(L.MANAGED_BY) == L.MANAGED_BY_VALUE or holds_meter(pod):
        return True
    return str((pod.get("spec") or {}).get("nodeName") or "") in virtual_nodes


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
    pod: Mapping[str, Any], event_type: str, node_clusters: Mapping[str, str], now: datetime,
    running_seen: datetime | None = None, offers: Mapping[str, GpuOffer] | None = None,
) -> MeteredRun | None:
    """The record of a run that just ended, or None when the pod is still running or never held a GPU.

    ``node_clusters`` maps virtual node names to cluster ids (from the inventory); a pod that ran
    elsewhere is not an offloaded run. Its times are what the origin observed, never the container times
    Liqo copies from the donor's status: it starts when the meter first saw it Running (``running_seen``),
    else (the meter never saw it run) at its creation, and ends when the meter sees it end (``now``), or at
    its deletion if that came first (held by the meter's finalizer, perhaps while the hub was down).

    ``offers`` says how each virtual node's donor lends GPUs: a pod holding shares, a MIG profile or an
    isolator's memory there is charged for that part of a GPU (``sharing.held_share``), counted from the
    resources it asked for, as the donor's scheduler counted them (not from anything the pod says).
    """
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "")
    meta = pod.get("metadata") or {}
    deleting = parse_time(meta.get("deletionTimestamp"))
    if phase not in FINISHED_PHASES and event_type != "DELETED" and not (deleting and ended_deleting(pod, now)):
        return None
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    gpus = pod_gpus(pod)
    offer = (offers or {}).get(node)
    share = None
    if offer is not None and offer.mode != "none":
        held = held_share(pod_devices(pod), offer)
        if held > 0 and held != gpus:  # shares, a profile or an isolator's memory: charged as that part
            gpus, share = max(1, math.ceil(held)), held
    if not node or node not in node_clusters or gpus < 1:
        return None
    if running_seen is None and not donor_says_started(status):
        return None  # never started: it held no GPU time
    created = parse_time(meta.get("creationTimestamp"))
    started = min(max(running_seen or created or now, created or now), now)
    ended = max(min(deleting, now) if deleting else now, started)
    return MeteredRun(
        pod_uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
        namespace=str(meta.get("namespace") or ""),
        pod=str(meta.get("name") or ""),
        user=pod_user(pod),
        cluster_id=node_clusters[node],
        node=node,
        gpus=gpus,
        started=started,
        ended=ended,
        phase=phase if phase in FINISHED_PHASES else "Deleted",
        preempted=preempted(pod),
        share=share,
    )
