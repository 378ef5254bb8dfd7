"""The Queues page's records: Kueue's state of the pool for admins, built from the objects the hub's watches
keep (ClusterQueue, ResourceFlavors, WorkloadPriorityClasses, Workloads). Pure: no I/O here.

Everything shown is what Kueue itself reports (quota from the ClusterQueue's spec, usage from its status,
a Workload's state from its conditions); nothing is recomputed, so the page agrees with ``kubectl`` and with
what users see under their cells. Kueue's free texts (a Workload's message, a priority class's description, a
flavor's annotations, an owner's name, the watches' errors) are someone else's words: the page escapes HTML, and
``shown`` makes them one printable line of bounded length, as everywhere else they are quoted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.kueue import QueueSettings
from gpu_offload.liqo_peering.timestamps import parse_time
from gpu_offload.liqo_peering.untrusted_text import shown

Obj = Mapping[str, Any]
RESOURCES = (L.GPU_RESOURCE, "cpu", "memory")


@dataclass(frozen=True)
class FlavorRow:
    """One flavor of the ClusterQueue, in the order Kueue tries them."""

    name: str
    cluster_id: str
    model: str
    quota: Mapping[str, str]
    """Nominal quota per resource (nvidia.com/gpu, cpu, memory), as the ClusterQueue's spec has it."""
    used: Mapping[str, str]
    """Usage per resource, from the ClusterQueue's status."""


@dataclass(frozen=True)
class WorkloadRow:
    """One Workload that waits or holds quota."""

    user: str
    namespace: str
    name: str
    owner: str
    """What Kueue queues: ``Pod runner-...`` or ``Job ...``."""
    priority_class: str
    priority: int
    state: str
    """admitted, pending, or evicted (being stopped)."""
    gpus: int
    flavor: str
    age_seconds: float | None
    """Since it was admitted (admitted, evicted) or queued (pending)."""
    message: str
    """Kueue's words: why it waits, or what evicted it."""


@dataclass(frozen=True)
class UserQueueRow:
    """Per user: how many Workloads wait and how many hold quota, and their GPUs."""

    user: str
    pending: int
    admitted: int
    gpus_admitted: int
    gpus_pending: int


@dataclass(frozen=True)
class PriorityRow:
    name: str
    value: int
    description: str
    default: bool


@dataclass(frozen=True)
class QueuesView:
    """Everything the Queues page shows; ``enabled`` False: queueing is off (the page says how to turn it on)."""

    enabled: bool
    cluster_queue: str = ""
    exists: bool = False
    strategy: str = ""
    fair_sharing: bool = False
    preemption: str = ""
    flavors: tuple[FlavorRow, ...] = ()
    users: tuple[UserQueueRow, ...] = ()
    workloads: tuple[WorkloadRow, ...] = field(default_factory=tuple)
    priority_classes: tuple[PriorityRow, ...] = ()
    watch_error: str = ""


def _true(obj: Obj, type_: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_ and c.get("status") == "True"), None)


def _condition(obj: Obj, type_: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def _gpus(workload: Obj) -> int:
    total = 0
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        spec = ((pod_set.get("template") or {}).get("spec") or {})
        per_pod = 0
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            value = (resources.get("requests") or {}).get(L.GPU_RESOURCE, (resources.get("limits") or {}).get(
                L.GPU_RESOURCE, 0))
            try:
                per_pod += int(str(value))
            except ValueError:
                continue  # an odd quantity in someone's Workload: shown as 0, never a failed page
        total += per_pod * int(pod_set.get("count") or 1)
    return total


def _totals(entries: Iterable[Obj]) -> dict[str, dict[str, str]]:
    return {str(f.get("name")): {str(r.get("name")): str(r.get("total", "0")) for r in f.get("resources") or []}
            for f in entries}


def _flavors(queue: Obj, flavors: Iterable[Obj]) -> tuple[FlavorRow, ...]:
    notes = {f["metadata"]["name"]: (f["metadata"].get("annotations") or {}) for f in flavors}
    used = _totals((queue.get("status") or {}).get("flavorsUsage") or [])
    rows = []
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            name = str(flavor.get("name"))
            quota = {str(r.get("name")): str(r.get("nominalQuota")) for r in flavor.get("resources") or []}
            note = notes.get(name, {})
            rows.append(FlavorRow(name, shown(note.get(L.REMOTE_CLUSTER_ID_LABEL, "?")),
                                  shown(note.get(L.GPU_MODEL, "-")),
                                  {r: quota.get(r, "0") for r in RESOURCES},
                                  {r: used.get(name, {}).get(r, "0") for r in RESOURCES}))
    return tuple(rows)


def _priority_class(wl: Obj) -> str:
    ref = (wl.get("spec") or {}).get("priorityClassRef")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return str(name or ((wl.get("metadata") or {}).get("labels") or {}).get(L.PRIORITY_CLASS_LABEL) or "-")


def _workload_row(wl: Obj, user: str, now: datetime) -> WorkloadRow:
    meta: Obj = wl.get("metadata") or {}
    owner: Obj = next(iter(meta.get("ownerReferences") or []), {})
    admitted, evicted = _true(wl, "Admitted"), _true(wl, "Evicted")
    state = "evicted" if evicted and admitted else "admitted" if admitted else "pending"
    since = admitted if admitted else None
    reserved = _condition(wl, "QuotaReserved") or {}
    when = parse_time((since or {}).get("lastTransitionTime") or meta.get("creationTimestamp"))
    message = shown((evicted or {}).get("message") or ("" if admitted else reserved.get("message") or ""))
    assignments = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    flavor = next((str(v) for a in assignments for v in (a.get("flavors") or {}).values()), "")
    return WorkloadRow(user, str(meta.get("namespace", "")), str(meta.get("name", "")),
                       shown(f"{owner.get('kind', '?')} {owner.get('name', '?')}"),
                       shown(_priority_class(wl)),
                       int((wl.get("spec") or {}).get("priority") or 0), state, _gpus(wl), flavor or "-",
                       (now - when).total_seconds() if when else None, message)


def queues_view(settings: QueueSettings | None, queues: Iterable[Obj], flavors: Iterable[Obj],
                priority_classes: Iterable[Obj], workloads: Iterable[Obj], user_of: Callable[[str], str],
                now: datetime, watch_error: str = "") -> QueuesView:
    """The page's records. ``user_of(namespace)`` names the hub user owning a namespace (the namespace's
    name when it belongs to nobody known); only Workloads of the LocalQueues of this ClusterQueue count."""
    if settings is None:
        return QueuesView(False)
    watch_error = shown(watch_error, 600)  # the API servers' messages, one per failing watch
    name = settings.cluster_queue
    queue = next((q for q in queues if q["metadata"]["name"] == name), None)
    configured = {c.name for c in settings.priority_classes}
    classes = tuple(sorted((PriorityRow(str(c["metadata"]["name"]), int(c.get("value") or 0),
                                        shown(c.get("description") or ""), c["metadata"]["name"] == settings.default_priority)
                            for c in priority_classes if c["metadata"]["name"] in configured),
                           key=lambda r: (-r.value, r.name)))
    if queue is None:
        return QueuesView(True, name, priority_classes=classes, watch_error=watch_error)
    rows = [_workload_row(w, user_of(str(w["metadata"].get("namespace", ""))), now) for w in workloads
            if (w.get("spec") or {}).get("queueName") == settings.local_queue and not _true(w, "Finished")
            and ((w.get("status") or {}).get("admission") or {}).get("clusterQueue", name) == name]
    rows.sort(key=lambda r: ({"admitted": 0, "evicted": 1, "pending": 2}[r.state], -r.priority,
                             -(r.age_seconds or 0), r.namespace, r.name))
    per_user: dict[str, list[WorkloadRow]] = {}
    for row in rows:
        per_user.setdefault(row.user, []).append(row)
    users = tuple(UserQueueRow(u, sum(r.state == "pending" for r in mine), sum(r.state != "pending" for r in mine),
                               sum(r.gpus for r in mine if r.state != "pending"),
                               sum(r.gpus for r in mine if r.state == "pending"))
                  for u, mine in sorted(per_user.items()))
    spec = queue.get("spec") or {}
    return QueuesView(
        True, name, True, str(spec.get("queueingStrategy") or "BestEffortFIFO"),
        (spec.get("admissionScope") or {}).get("admissionMode") == "UsageBasedAdmissionFairSharing",
        str((spec.get("preemption") or {}).get("withinClusterQueue") or "Never"),
        _flavors(queue, flavors), users, tuple(rows), classes, watch_error)
