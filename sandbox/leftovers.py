"""What a module sharing an origin must leave as it found it, read from the origin's store.

Modules that ask for the same origin configuration share one origin for the whole session
(``fixtures.origin_pool``), so a module that leaves a cordoned virtual node, a changed label, an extra
ResourceSlice, an active fault or a running pod changes what every later module sees, in an order that
depends on xdist's grouping. :func:`cluster_state` reads what lasts beyond one test's own namespaces, and
:func:`differences` names what changed, so the module that left it fails instead of a later one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from .apiserver.api import Api

# Kinds that change on their own and carry nothing a later module relies on: events, leases, and the
# namespaces themselves (each test makes and deletes its own; what is in them is read below).
IGNORED = frozenset({("", "events"), ("events.k8s.io", "events"), ("coordination.k8s.io", "leases"),
                     ("", "namespaces"), ("discovery.k8s.io", "endpointslices"), ("", "endpoints")})
FINISHED = ("Succeeded", "Failed")
TENANT_LABEL = "liqo.io/tenant-namespace"
State = Mapping[str, Any]


def _lasting(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a later module reads of an object: its labels, annotations and spec, and for nodes and peerings
    which conditions hold (not their heartbeats)."""
    meta = obj.get("metadata", {})
    status = obj.get("status") or {}
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return {
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "spec": obj.get("spec"),
        "deleting": "deletionTimestamp" in meta,
        "conditions": sorted((c.get("type", ""), c.get("status", "")) for c in conditions or () if isinstance(c, dict)),
    }


def cluster_state(api: Api, system: Collection[str], faults: Collection[str] = ()) -> dict[str, Any]:
    """Everything outside the namespaces tests make: cluster-scoped objects and those of the ``system``
    namespaces (:func:`system_namespaces`) and of Liqo's tenant namespaces (:func:`tenant_namespaces`, with the
    namespaces themselves), each with what a later module reads; unfinished pods anywhere;
    active faults by name."""
    store = api.store
    objects: dict[str, Any] = {}
    pods: list[str] = []
    tenants = tenant_namespaces(api)
    kept = set(system) | tenants
    for key in store.storage_keys():
        if key in IGNORED and key != ("", "namespaces"):
            continue
        for obj in store.snapshots(key)[0]:
            meta = obj["metadata"]
            namespace = meta.get("namespace", "")
            where = f"{key[1]}.{key[0] or 'core'} {namespace + '/' if namespace else ''}{meta['name']}"
            if key == ("", "namespaces"):  # a test's own come and go; a peering's tenant namespace must go with it
                if meta["name"] in tenants:
                    objects[where] = _lasting(obj)
            elif key == ("", "pods"):
                if (obj.get("status") or {}).get("phase") not in FINISHED:
                    pods.append(where)
            elif not namespace or namespace in kept:
                objects[where] = _lasting(obj)
    return {"objects": objects, "pods": sorted(pods), "faults": sorted(faults)}


def tenant_namespaces(api: Api) -> set[str]:
    """The Liqo tenant namespaces there are now (one per peered donor): a donor peered for one module brings one,
    and unpeering it must take it, and everything in it, away."""
    return {ns["metadata"]["name"] for ns in api.store.list(("", "namespaces"))[0]
            if (ns["metadata"].get("labels") or {}).get(TENANT_LABEL) == "true"}


def system_namespaces(api: Api) -> frozenset[str]:
    """The namespaces of a freshly started origin (its seed: tenant namespaces, kube-system, ...)."""
    return frozenset(ns["metadata"]["name"] for ns in api.store.list(("", "namespaces"))[0])


def _changes(old: Any, new: Any, path: str) -> list[str]:
    """The paths where ``new`` differs from ``old``, down through mappings (``spec.labels.team: None -> 'ml'``)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [change for key in sorted(old.keys() | new.keys(), key=str)
                for change in _changes(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))]
    return [f"{path}: {old!r} -> {new!r}"]


def differences(before: State, after: State) -> list[str]:
    """One line per change from ``before`` to ``after`` (empty when the origin is as it was)."""
    lines: list[str] = []
    old, new = before["objects"], after["objects"]
    lines += [f"{where} was deleted" for where in sorted(old.keys() - new.keys())]
    lines += [f"{where} was left behind" for where in sorted(new.keys() - old.keys())]
    for where in sorted(old.keys() & new.keys()):
        lines += [f"{where}: {change}" for change in _changes(old[where], new[where], "")]
    lines += [f"{pod} is still running" for pod in after["pods"] if pod not in before["pods"]]
    lines += [f"fault {fault} is still active" for fault in after["faults"] if fault not in before["faults"]]
    return lines
