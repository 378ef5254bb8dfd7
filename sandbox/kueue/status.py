"""ClusterQueue and LocalQueue status as Kueue's cache reports it: pending, reserving and admitted
Workload counts, per-flavor reservation and usage, an Active condition, and a LocalQueue's Admission
Fair Sharing consumption. Written only when it changes."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.patching import MERGE
from . import names
from .cycle import QueueView

Obj = dict[str, Any]


def _flavors(usage: Mapping[str, Mapping[str, Decimal]], view: QueueView, borrowed: bool = True) -> list[Obj]:
    """Per flavor and covered resource, the total (a LocalQueue's status has no ``borrowed``)."""
    def resource(flavor: str, name: str) -> Obj:
        out: Obj = {"name": name, "total": format(usage.get(flavor, {}).get(name, Decimal(0)).normalize(), "f")}
        if borrowed:
            out["borrowed"] = "0"
        return out
    return [{"name": f.name, "resources": [resource(f.name, r) for r in view.covered]} for f in view.flavors]


def _active(message: str, old: Mapping[str, Any]) -> list[Obj]:
    conditions = [dict(c) for c in old.get("conditions") or []]
    names.set_condition(conditions, names.condition("Active", True, "Ready", message))
    return conditions


def _write(api: Api, kind: str, obj: Obj, new: Obj) -> None:
    old = obj.get("status") or {}
    if all(old.get(k) == v for k, v in new.items()):
        return
    meta = obj["metadata"]
    with names.raced():
        api.patch(api.kind(names.API_VERSION, kind), meta.get("namespace", ""), meta["name"], {"status": new},
                  MERGE, "status")


def _amounts(values: Mapping[str, float]) -> dict[str, str]:
    return {r: (f"{v:.3f}".rstrip("0").rstrip(".") or "0") for r, v in sorted(values.items())}


def write(api: Api, views: Mapping[str, QueueView], queues: Mapping[str, Obj],
          sampled: Mapping[str, Mapping[str, float]]) -> None:
    """Write every ClusterQueue's and LocalQueue's status (``sampled``: the LocalQueues whose fair-sharing
    usage was just sampled, with it)."""
    for view in views.values():
        old = view.cluster_queue.get("status") or {}
        flavors = _flavors(view.used, view)
        _write(api, "ClusterQueue", view.cluster_queue, {
            "pendingWorkloads": len(view.pending),
            "reservingWorkloads": len(view.admitted), "admittedWorkloads": len(view.admitted),
            "flavorsReservation": flavors, "flavorsUsage": flavors,
            "conditions": _active("Can admit new workloads", old)})
    for key, lq in queues.items():
        lq_view = views.get((lq.get("spec") or {}).get("clusterQueue", ""))
        if lq_view is None:
            continue
        view = lq_view
        namespace, name = key.split("/", 1)
        mine = [(a, w) for a, w in view.admitted if w["metadata"]["namespace"] == namespace
                and w["spec"].get("queueName") == name]
        usage: dict[str, dict[str, Decimal]] = {}
        for adm, _ in mine:
            bucket = usage.setdefault(adm.flavor, {})
            for r, v in adm.usage.items():
                bucket[r] = bucket.get(r, Decimal(0)) + v
        old = lq.get("status") or {}
        new: Obj = {
            "pendingWorkloads": sum(1 for e, _ in view.pending if e.namespace == namespace and e.queue == name),
            "reservingWorkloads": len(mine), "admittedWorkloads": len(mine),
            "flavorsReservation": _flavors(usage, view, False), "flavorsUsage": _flavors(usage, view, False),
            "conditions": _active("Can submit new workloads to localQueue", old)}
        if key in sampled:
            new["fairSharing"] = {"weightedShare": 0, "admissionFairSharingStatus": {
                "consumedResources": _amounts(sampled[key]), "lastUpdate": now()}}
        _write(api, "LocalQueue", lq, new)
