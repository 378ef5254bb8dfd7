"""One scheduling cycle of Kueue for one ClusterQueue, with the API writes it implies: admit in queue
order (BestEffortFIFO skips a Workload that does not fit, StrictFIFO stops at it), preempt lower
priorities when ``withinClusterQueue: LowerPriority``, and word the Workload conditions and events as
Kueue does (pkg/scheduler/scheduler.go, pkg/workload, pkg/workload/evict)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from dateutil.parser import isoparse

from ..apiserver import events
from ..apiserver.api import Api
from ..apiserver.patching import MERGE
from . import names, owners, workloads
from .preemption import Admitted, victims
from .scheduler import Entry, Flavor, add, allowed, assign, order

Obj = dict[str, Any]


@dataclass
class QueueView:
    """A ClusterQueue and its Workloads as one cycle sees them."""

    cluster_queue: Obj
    covered: tuple[str, ...]
    flavors: tuple[Flavor, ...]
    pending: list[tuple[Entry, Obj]] = field(default_factory=list)
    admitted: list[tuple[Admitted, Obj]] = field(default_factory=list)
    used: dict[str, dict[str, Decimal]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.cluster_queue["metadata"]["name"])

    def policy(self, key: str, default: str) -> str:
        spec = self.cluster_queue.get("spec") or {}
        if key == "withinClusterQueue":
            return str((spec.get("preemption") or {}).get(key, default))
        return str(spec.get(key, default))


def patch_status(api: Api, workload: Mapping[str, Any], status: Obj) -> None:
    meta = workload["metadata"]
    with names.raced():
        api.patch(api.kind(names.API_VERSION, "Workload"), meta["namespace"], meta["name"], {"status": status},
                  MERGE, "status")


def _conditions(workload: Mapping[str, Any]) -> list[Obj]:
    return [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]


def _previously(conditions: list[Obj], type_: str, reason: str, generation: int | None) -> None:
    for cond in conditions:
        if cond["type"] == type_ and cond["status"] == "True":
            names.set_condition(conditions, names.condition(type_, False, reason, "Previously: " + cond["message"],
                                                            generation))


def admit(api: Api, view: QueueView, entry: Entry, workload: Obj, flavor: str) -> None:
    """Reserve quota and admit (no admission checks: both at once), then start the owner."""
    gen = workload["metadata"].get("generation")
    conditions = _conditions(workload)
    names.set_condition(conditions, names.condition(names.QUOTA_RESERVED, True, "QuotaReserved",
                                                    f"Quota reserved in ClusterQueue {view.name}", gen))
    names.set_condition(conditions, names.condition(names.ADMITTED, True, "Admitted", "The workload is admitted",
                                                    gen))
    _previously(conditions, names.EVICTED, "QuotaReserved", gen)
    _previously(conditions, names.PREEMPTED, "QuotaReserved", gen)
    assignments = []
    for pod_set in workload["spec"]["podSets"]:
        count = int(pod_set.get("count", 1))
        per_pod = workloads.requests({"spec": {"podSets": [dict(pod_set, count=count)]}})
        used = {r: v for r, v in per_pod.items() if r in view.covered and v > 0}
        assignments.append({"name": pod_set["name"], "count": count,
                            "flavors": {r: flavor for r in sorted(used)},
                            "resourceUsage": {r: format(v.normalize(), "f") for r, v in sorted(used.items())}})
    # the requeue count survives admission (the backoff grows with each requeue); requeueAt goes
    requeues = ((workload.get("status") or {}).get("requeueState") or {}).get("count")
    state = {"count": requeues, "requeueAt": None} if requeues else None
    patch_status(api, workload, {"conditions": conditions, "requeueState": state,
                                 "admission": {"clusterQueue": view.name, "podSetAssignments": assignments}})
    events.record(api, workload, "Normal", "QuotaReserved",
                  f"Quota reserved in ClusterQueue {view.name}, wait time since queued was {_waited(workload)}s",
                  names.COMPONENT)
    events.record(api, workload, "Normal", "Admitted",
                  f"Admitted by ClusterQueue {view.name}, wait time since reservation was 0s", names.COMPONENT)
    flavor_obj = api.find(api.kind(names.API_VERSION, "ResourceFlavor"), "", flavor) or {}
    owners.start(api, workload, flavor_obj, view.name)


def _waited(workload: Obj) -> str:
    # Kueue's QueuedWaitTime: since the last requeue, else since creation (not the queue-order time)
    requeued = names.find(workload, names.REQUEUED)
    since = requeued["lastTransitionTime"] if requeued else workload["metadata"]["creationTimestamp"]
    seconds = (datetime.now(timezone.utc) - isoparse(since)).total_seconds()
    return f"{max(seconds, 0):.0f}"


def evict(api: Api, workload: Obj, reason: str, message: str, preempted: bool = False) -> None:
    """Evict (``Evicted`` condition, and ``Preempted`` when preempted) and stop the owner."""
    gen = workload["metadata"].get("generation")
    conditions = _conditions(workload)
    names.set_condition(conditions, names.condition(names.EVICTED, True, reason, message, gen))
    if preempted:
        names.set_condition(conditions, names.condition(names.PREEMPTED, True, names.IN_CLUSTER_QUEUE, message))
    patch_status(api, workload, {"conditions": conditions})
    events.record(api, workload, "Normal", f"EvictedDueTo{reason}", message, names.COMPONENT)
    workload.setdefault("status", {})["conditions"] = conditions
    owners.stop(api, workload, reason, message)


def mark_pending(api: Api, workload: Obj, message: str, reason: str = names.PENDING) -> None:
    """QuotaReserved=False with why; an event only when the message changes, as Kueue's status patch."""
    old = names.find(workload, names.QUOTA_RESERVED)
    if old is not None and old.get("status") == "False" and old.get("message") == message:
        return
    conditions = _conditions(workload)
    names.set_condition(conditions, names.condition(names.QUOTA_RESERVED, False, reason, message,
                                                    workload["metadata"].get("generation")))
    patch_status(api, workload, {"conditions": conditions})
    events.record(api, workload, "Warning", reason, message, names.COMPONENT)


def _preempt(api: Api, view: QueueView, entry: Entry, workload: Obj) -> str:
    """Issue preemptions for ``entry`` if lower priorities can make room; the pending message to show."""
    evicting = [(a, w) for a, w in view.admitted if names.is_true(w, names.EVICTED)]
    room = {f: dict(v) for f, v in view.used.items()}
    for adm, _ in evicting:
        add(room, adm.flavor, adm.usage, -1)
    if assign(entry.requests, view.covered, view.flavors, room, entry).flavor is not None:
        return "Pending the preemption of workloads already being stopped"
    candidates = [a for a, w in view.admitted if not names.is_true(w, names.EVICTED)]
    choice = victims(entry.requests, entry.priority, allowed(entry, view.flavors), candidates, room)
    if choice is None or not choice[1]:
        return ""
    by_key = {(a.namespace, a.name): w for a, w in view.admitted}
    uid = workload["metadata"]["uid"]
    job_uid = (workload["metadata"].get("labels") or {}).get(names.JOB_UID_LABEL, "UNKNOWN")
    message = (f"Preempted to accommodate a workload (UID: {uid}, JobUID: {job_uid}) due to prioritization in "
               f"the ClusterQueue; preemptor path: /{view.name}; preemptee path: /{view.name}")
    for victim in choice[1]:
        evict(api, by_key[(victim.namespace, victim.name)], "Preempted", message, preempted=True)
    return f"Pending the preemption of {len(choice[1])} workload(s)"


def run(api: Api, view: QueueView, usage_of: Callable[[], Mapping[str, float]] | None,
        on_admit: Callable[[Entry], None]) -> list[Entry]:
    """Admit what fits, head first; returns the Workloads still pending, in queue order."""
    pending = {(e.namespace, e.name): (e, w) for e, w in view.pending}
    strict = view.policy("queueingStrategy", "BestEffortFIFO") == "StrictFIFO"
    preempt = view.policy("withinClusterQueue", "Never") == "LowerPriority"
    while True:
        ordered = order((e for e, _ in pending.values()), usage_of() if usage_of else None)
        admitted_one = False
        for entry in ordered:
            workload = pending[(entry.namespace, entry.name)][1]
            fit = assign(entry.requests, view.covered, view.flavors, view.used, entry)
            if fit.flavor is not None:
                admit(api, view, entry, workload, fit.flavor)
                add(view.used, fit.flavor, {r: v for r, v in entry.requests.items() if r in view.covered})
                on_admit(entry)
                del pending[(entry.namespace, entry.name)]
                admitted_one = True
                break  # usage changed: the order may too (Admission Fair Sharing)
            note = _preempt(api, view, entry, workload) if preempt and fit.fits_ever else ""
            mark_pending(api, workload, f"{fit.message}. {note}" if note else fit.message)
            if strict:
                break
        if not admitted_one:
            return ordered
