"""What happens around creation and deletion: graceful pod deletion, finalizers and deletionTimestamp,
ownerReference garbage collection (Orphan, Background, Foreground), namespace termination, the default
ServiceAccount of a new namespace and CRDs created through the API.

Unlike a real cluster, garbage collection and namespace cleanup run synchronously inside the DELETE call
(no controller lag). Clients must not rely on either timing; the sandbox's choice keeps tests deterministic.
Simplifications: every dependent blocks a foreground deletion (blockOwnerDeletion is not consulted), and a
CRD deleted through the API keeps serving its resource until restart.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from .defaults import now
from .logs import LogBuffers
from .resources import ResourceRegistry, ResourceType
from .store import Store, clone

Obj = dict[str, Any]


class Api(Protocol):
    """What creation and deletion need of the API (``api.Api`` is the one that has it): its store, registry
    and logs, lookups and creates, and the kubelet's say on a pod's graceful end."""

    store: Store
    registry: ResourceRegistry
    logs: LogBuffers
    pod_termination: Callable[[Obj], bool] | None

    def type(self, group: str, version: str, plural: str) -> ResourceType: ...

    def find(self, rt: ResourceType, namespace: str, name: str) -> Obj | None: ...

    def create(self, rt: ResourceType, body: Obj, namespace: str = "") -> Obj: ...

FOREGROUND = "foregroundDeletion"
# batch/v1 Jobs orphan their pods when the client names no policy (kept for backwards compatibility)
_DEFAULT_ORPHAN = {("batch", "jobs")}


def after_create(api: Api, rt: ResourceType, obj: Obj) -> None:
    """Side effects of a create: a namespace gets its ``default`` ServiceAccount, a CRD gets served."""
    if rt.key == ("", "namespaces"):
        sa = api.type("", "v1", "serviceaccounts")
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        api.create(sa, body, obj["metadata"]["name"])
    elif rt.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
        api.registry.add_crd(obj)


def _status_success(rt: ResourceType, obj: Obj) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": obj["metadata"]["name"], "group": rt.group, "kind": rt.plural,
                        "uid": obj["metadata"]["uid"]}}


def delete(api: Api, rt: ResourceType, obj: Obj, grace: int | None, propagation: str | None) -> Obj:
    """Delete ``obj`` now, or mark it (deletionTimestamp) when finalizers or a kubelet must act first."""
    meta = obj["metadata"]
    if propagation is None:
        propagation = "Orphan" if rt.key in _DEFAULT_ORPHAN else "Background"
    if rt.key == ("", "namespaces"):
        return _delete_namespace(api, rt, obj)
    if propagation == "Orphan":
        _orphan_dependents(api, meta["uid"])
    if rt.key == ("", "pods") and _graceful(api, obj, grace):
        return _mark(api, rt, obj, grace if grace is not None else obj["spec"].get("terminationGracePeriodSeconds", 30))
    if propagation == "Foreground" and _dependents(api, meta["uid"]):
        if FOREGROUND not in meta.setdefault("finalizers", []):
            meta["finalizers"].append(FOREGROUND)
        marked = _mark(api, rt, obj, 0)
        for dep_rt, dep in _dependents(api, meta["uid"]):
            if not dep["metadata"].get("deletionTimestamp"):
                delete(api, dep_rt, clone(dep), None, "Foreground")
        _settle_foreground(api)
        return api.find(rt, meta.get("namespace", ""), meta["name"]) or marked
    if meta.get("finalizers"):
        if not meta.get("deletionTimestamp"):
            return _mark(api, rt, obj, 0)
        if meta.get("deletionGracePeriodSeconds") and grace == 0:  # the kubelet is done: finalizers alone hold it
            meta["deletionGracePeriodSeconds"] = 0
            return api.store.put(rt.key, obj, "MODIFIED")
        return obj
    removed = remove(api, rt, obj)
    returns_object = rt.custom or rt.kind in ("Pod", "Job", "Service", "Node")
    return removed if returns_object else _status_success(rt, removed)


def _graceful(api: Api, pod: Obj, grace: int | None) -> bool:
    if grace == 0 or not pod["spec"].get("nodeName") or api.pod_termination is None:
        return False
    if pod["metadata"].get("deletionTimestamp"):
        return True  # already terminating: the kubelet finishes it
    return bool(api.pod_termination(pod))


def _mark(api: Api, rt: ResourceType, obj: Obj, grace: int) -> Obj:
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        return obj
    when = datetime.now(timezone.utc) + timedelta(seconds=grace)
    meta["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    meta["deletionGracePeriodSeconds"] = grace
    return api.store.put(rt.key, obj, "MODIFIED")


def remove(api: Api, rt: ResourceType, obj: Obj) -> Obj:
    """Take ``obj`` out of the store for good, then collect what depended on it."""
    meta = obj["metadata"]
    ns = meta.get("namespace", "")
    gone = api.store.remove(rt.key, ns, meta["name"])
    if gone is None:
        return obj
    if rt.key == ("", "pods"):
        api.logs.drop(ns, meta["name"])
    elif rt.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
        _drop_custom_resources(api, gone)
    _collect_garbage(api, meta["uid"])
    _settle_foreground(api)
    if ns:
        _finish_namespace(api, ns)
    return gone


def _drop_custom_resources(api: Api, crd: Obj) -> None:
    """A deleted CRD takes its objects with it and its resource is no longer served, as the real API server's
    customresourcecleanup finalizer does (a test that installs an operator's CRDs on a shared origin removes them
    this way). The objects' own finalizers are not waited for: a gap nothing here relies on."""
    for rt in api.registry.remove_crd(crd)[:1]:  # every version is stored under the one group/plural key
        for obj in api.store.list(rt.key)[0]:
            api.store.remove(rt.key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _all_objects(api: Api) -> list[tuple[ResourceType, Obj]]:
    # stored snapshots, read-only: whoever changes one clones it first
    types = {t.key: t for t in api.registry.all()}
    out = []
    for key in api.store.storage_keys():
        if key in types:
            out += [(types[key], o) for o in api.store.snapshots(key)[0]]
    return out


def _dependents(api: Api, uid: str) -> list[tuple[ResourceType, Obj]]:
    return [(rt, o) for rt, o in _all_objects(api)
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])]


def _collect_garbage(api: Api, owner_uid: str) -> None:
    # a dependent goes once none of its owners exists any more (Background propagation)
    live = {o["metadata"]["uid"] for _, o in _all_objects(api)}
    for rt, dep in _dependents(api, owner_uid):
        refs = dep["metadata"].get("ownerReferences") or []
        if not any(ref.get("uid") in live for ref in refs):
            fresh = api.find(rt, dep["metadata"].get("namespace", ""), dep["metadata"]["name"])
            if fresh is not None and not fresh["metadata"].get("deletionTimestamp"):
                delete(api, rt, fresh, None, "Background")


def _orphan_dependents(api: Api, owner_uid: str) -> None:
    for rt, snapshot in _dependents(api, owner_uid):
        dep = clone(snapshot)
        dep["metadata"]["ownerReferences"] = [
            r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
        if not dep["metadata"]["ownerReferences"]:
            del dep["metadata"]["ownerReferences"]
        api.store.put(rt.key, dep, "MODIFIED")


def _settle_foreground(api: Api) -> None:
    # owners waiting in foreground deletion lose their finalizer once no dependent is left
    for rt, snapshot in _all_objects(api):
        waiting = snapshot["metadata"].get("deletionTimestamp") and FOREGROUND in (
            snapshot["metadata"].get("finalizers") or [])
        if waiting and not _dependents(api, snapshot["metadata"]["uid"]):
            obj = clone(snapshot)
            meta = obj["metadata"]
            meta["finalizers"] = [f for f in meta["finalizers"] if f != FOREGROUND]
            if meta["finalizers"]:
                api.store.put(rt.key, obj, "MODIFIED")
            else:
                remove(api, rt, obj)


def _delete_namespace(api: Api, rt: ResourceType, ns_obj: Obj) -> Obj:
    name = ns_obj["metadata"]["name"]
    if not ns_obj["metadata"].get("deletionTimestamp"):
        ns_obj = copy.deepcopy(ns_obj)
        ns_obj["metadata"]["deletionTimestamp"] = now()
        ns_obj["metadata"]["deletionGracePeriodSeconds"] = 0
        ns_obj.setdefault("status", {})["phase"] = "Terminating"
        ns_obj = api.store.put(rt.key, ns_obj, "MODIFIED")
    for obj_rt, obj in _all_objects(api):
        if obj_rt.namespaced and obj["metadata"].get("namespace") == name:
            fresh = api.find(obj_rt, name, obj["metadata"]["name"])
            if fresh is not None and not fresh["metadata"].get("deletionTimestamp"):
                delete(api, obj_rt, fresh, None, "Background")
    _finish_namespace(api, name)
    return api.find(rt, "", name) or ns_obj


def _finish_namespace(api: Api, namespace: str) -> None:
    # a terminating namespace goes once it is empty and its own finalizers are gone
    ns_rt = api.type("", "v1", "namespaces")
    ns_obj = api.find(ns_rt, "", namespace)
    if ns_obj is None or not ns_obj["metadata"].get("deletionTimestamp"):
        return
    if any(rt.namespaced and o["metadata"].get("namespace") == namespace for rt, o in _all_objects(api)):
        return
    if not ns_obj["metadata"].get("finalizers"):
        api.store.remove(ns_rt.key, "", namespace)
