"""Kueue's finalizers, let go as its reconcilers let go of them (Kueue 0.19: jobframework's reconciler,
pod_controller.go, the ClusterQueue and ResourceFlavor controllers).

- a managed pod's ``kueue.x-k8s.io/managed``: once the pod is being deleted (Kueue first finishes its
  Workloads) or its Workload is Finished;
- a Workload's ``kueue.x-k8s.io/resource-in-use``: once it is Finished, being deleted (its owner stopped
  first), or its owner is gone or going, in which case it is first marked Finished (``OwnerNotFound``, "The
  workload's owner no longer exists": FinishOrphanedWorkloads, on by default since 0.18), which releases its
  quota;
- a ClusterQueue's: once no Workload holds quota in it; a ResourceFlavor's: once no ClusterQueue names it.

While Kueue is down none of this happens: a deleted queued pod stays Terminating until Kueue is back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..apiserver.api import Api
from ..apiserver.patching import MERGE
from . import names, owners

Obj = dict[str, Any]
ORPHANED = ("OwnerNotFound", "The workload's owner no longer exists")


def _without(api: Api, rt: Any, obj: Mapping[str, Any], finalizer: str) -> None:
    meta = obj["metadata"]
    kept = [f for f in meta.get("finalizers") or [] if f != finalizer]
    with names.raced():
        api.patch(rt, meta.get("namespace", ""), meta["name"], {"metadata": {"finalizers": kept or None}}, MERGE)


def _owner_going(api: Api, workload: Mapping[str, Any]) -> bool:
    """Whether every owner of the Workload is gone or being deleted."""
    refs = [r for r in workload["metadata"].get("ownerReferences") or [] if r.get("kind") in ("Pod", "Job")]
    if not refs:
        return False
    ns = workload["metadata"]["namespace"]
    for ref in refs:
        rt = api.type("", "v1", "pods") if ref["kind"] == "Pod" else api.type("batch", "v1", "jobs")
        owner = api.find(rt, ns, ref["name"])
        if owner is not None and owner["metadata"]["uid"] == ref.get("uid") and \
                not owner["metadata"].get("deletionTimestamp"):
            return False
    return True


def _finish(api: Api, workload: Obj) -> None:
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
    names.set_condition(conditions, names.condition(names.FINISHED, True, *ORPHANED,
                                                    workload["metadata"].get("generation")))
    meta = workload["metadata"]
    with names.raced():
        api.patch(api.kind(names.API_VERSION, "Workload"), meta["namespace"], meta["name"],
                  {"status": {"conditions": conditions}}, MERGE, "status")


def workloads(api: Api) -> None:
    """Let go of the Workloads Kueue is done with."""
    wl_rt = api.kind(names.API_VERSION, "Workload")
    for wl in api.list(wl_rt)["items"]:
        meta = wl["metadata"]
        if names.IN_USE_FINALIZER not in (meta.get("finalizers") or []):
            continue
        if _owner_going(api, wl):
            if names.is_true(wl, names.QUOTA_RESERVED) and names.is_true(wl, names.EVICTED):
                continue  # evicted: the controller gives its quota back first, then it is finished here
            if not names.is_true(wl, names.FINISHED):  # even when already being deleted with its owner
                _finish(api, wl)
        elif meta.get("deletionTimestamp"):
            owners.stop(api, wl, "WorkloadDeleted", "Workload is deleted")
        elif not names.is_true(wl, names.FINISHED):
            continue
        fresh = api.find(wl_rt, meta["namespace"], meta["name"])
        if fresh is not None:
            _without(api, wl_rt, fresh, names.IN_USE_FINALIZER)


def pods(api: Api, finished_owner_uids: set[str]) -> None:
    """Let go of managed pods being deleted or whose Workload is Finished."""
    pods_rt = api.type("", "v1", "pods")
    items, _ = api.store.snapshots(("", "pods"))
    for pod in items:
        meta = pod["metadata"]
        if names.POD_FINALIZER in (meta.get("finalizers") or []) and (
                meta.get("deletionTimestamp") or meta["uid"] in finished_owner_uids):
            _without(api, pods_rt, pod, names.POD_FINALIZER)


def queues(api: Api) -> None:
    """Let go of deleted ClusterQueues no Workload holds quota in, and of deleted flavors no queue names."""
    cq_rt = api.kind(names.API_VERSION, "ClusterQueue")
    rf_rt = api.kind(names.API_VERSION, "ResourceFlavor")
    cqs = api.list(cq_rt)["items"]
    wls = api.list(api.kind(names.API_VERSION, "Workload"))["items"]
    holding = {str(((w.get("status") or {}).get("admission") or {}).get("clusterQueue"))
               for w in wls if names.is_true(w, names.QUOTA_RESERVED) and not names.is_true(w, names.FINISHED)}
    for cq in cqs:
        meta = cq["metadata"]
        if meta.get("deletionTimestamp") and names.IN_USE_FINALIZER in (meta.get("finalizers") or []) \
                and meta["name"] not in holding:
            _without(api, cq_rt, cq, names.IN_USE_FINALIZER)
    named = {f.get("name") for cq in api.list(cq_rt)["items"]
             for group in (cq.get("spec") or {}).get("resourceGroups") or [] for f in group.get("flavors") or []}
    for rf in api.list(rf_rt)["items"]:
        meta = rf["metadata"]
        if meta.get("deletionTimestamp") and names.IN_USE_FINALIZER in (meta.get("finalizers") or []) \
                and meta["name"] not in named:
            _without(api, rf_rt, rf, names.IN_USE_FINALIZER)


def settle(api: Api) -> None:
    """One pass: Workloads first (a deleted pod's Workload is finished before the pod goes), then pods, queues."""
    workloads(api)
    finished = {ref.get("uid") for wl in api.list(api.kind(names.API_VERSION, "Workload"))["items"]
                if names.is_true(wl, names.FINISHED) for ref in wl["metadata"].get("ownerReferences") or []}
    pods(api, finished)
    queues(api)
