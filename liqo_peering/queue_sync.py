"""Bring Kueue's objects to what ``kueue.desired`` says: a pure diff, and one reconcile over a small API.

Idempotent: an object already as desired is not written, so a second run is free of writes. Only objects
labelled ``gpu-offload.io/managed-by=gpu-offload`` are changed or deleted; one of the same name that someone
else made is reported, never taken over. Used by ``gpu-offload queues sync`` and by the hub's controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kubernetes.utils import parse_quantity

from . import labels as L
from .kueue import Desired

Obj = Mapping[str, Any]
Verb = Literal["create", "patch", "delete"]
# Write order: flavors before the queue that names them; stale flavors after it stopped naming them (Kueue
# keeps a flavor a ClusterQueue still uses behind its finalizer).
_ORDER = {("create", "ResourceFlavor"): 0, ("patch", "ResourceFlavor"): 0, ("create", "WorkloadPriorityClass"): 1,
          ("patch", "WorkloadPriorityClass"): 1, ("create", "ClusterQueue"): 2, ("patch", "ClusterQueue"): 2,
          ("create", "LocalQueue"): 3, ("delete", "ResourceFlavor"): 4, ("delete", "WorkloadPriorityClass"): 4}
WRITES = tuple(_ORDER)
"""Every (verb, kind) a reconcile may write; it also lists each kind (the chart's RBAC follows this)."""


@dataclass(frozen=True)
class Change:
    """One write: a whole object to create, a merge patch, or a deletion."""

    verb: Verb
    kind: str
    name: str
    namespace: str | None = None
    body: Mapping[str, Any] | None = None
    detail: str = ""
    """What changes, in words (shown by ``--dry-run`` and in the audit log)."""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {self.kind} {where}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Plan:
    """The writes that bring the cluster to the desired objects, in a safe order, and what was left alone."""

    changes: tuple[Change, ...] = ()
    conflicts: tuple[str, ...] = ()
    """Objects of our names that gpu-offload does not manage, or cannot change in place, each with the fix."""
    warnings: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        lines = [str(c) for c in self.changes] or ["nothing to change"]
        return "\n".join(lines + [f"conflict: {c}" for c in self.conflicts] + [f"warning: {w}" for w in self.warnings])


def _managed(obj: Obj) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(L.MANAGED_BY) == L.MANAGED_BY_VALUE


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return bool(parse_quantity(a) == parse_quantity(b))
    except (ValueError, TypeError):
        return False


def covers(existing: Any, wanted: Any, key: str = "") -> bool:
    """Whether ``existing`` already holds everything in ``wanted``: extra keys (the API server's defaults,
    status) are ignored, lists must match item by item, quotas compare as quantities (``1Gi`` = ``1024Mi``)."""
    if isinstance(wanted, Mapping):
        return isinstance(existing, Mapping) and all(covers(existing.get(k), v, k) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (isinstance(existing, list) and len(existing) == len(wanted)
                and all(covers(e, w, key) for e, w in zip(existing, wanted, strict=True)))
    if key == "nominalQuota" and existing != wanted:
        return _same_quantity(existing, wanted)
    return bool(existing == wanted)


def _content(obj: Obj) -> dict[str, Any]:
    """What the reconcile owns in an object: its labels, annotations and every top-level field but metadata."""
    meta = obj.get("metadata") or {}
    owned = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    return {"metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta}, **owned}


def _describe(existing: Obj, wanted: Obj) -> str:
    keys = [k for k, v in _content(wanted).items() if not covers(existing.get(k), v, k)]
    return "changes " + ", ".join(keys)


def _quota_words(queue: Obj) -> str:
    parts = []
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            quota = {r["name"]: r["nominalQuota"] for r in flavor.get("resources") or []}
            parts.append(f"{flavor['name']} {quota.get(L.GPU_RESOURCE, 0)} GPU")
    return "quota " + (", ".join(parts) if parts else "none (no donor)")


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _sync_kind(kind: str, wanted: Iterable[Obj], existing: Iterable[Obj], delete_stale: bool,
               changes: list[Change], conflicts: list[str]) -> None:
    have = {_name(o): o for o in existing}
    wanted_names = set()
    for obj in wanted:
        name = _name(obj)
        wanted_names.add(name)
        current = have.get(name)
        detail = _quota_words(obj) if kind == "ClusterQueue" else ""
        if current is None:
            changes.append(Change("create", kind, name, body=obj, detail=detail))
        elif not _managed(current):
            conflicts.append(f"{kind} {name} exists and is not managed by gpu-offload: rename ours in the "
                             f"queueing settings, or label it {L.MANAGED_BY}={L.MANAGED_BY_VALUE} to hand it over")
        elif not covers(current, _content(obj)):
            words = detail or _describe(current, obj)
            changes.append(Change("patch", kind, name, body=_content(obj), detail=words))
    if delete_stale:
        for name, current in sorted(have.items()):
            if name not in wanted_names and _managed(current):
                changes.append(Change("delete", kind, name, detail="no longer in the pool"))


def _sync_local_queues(wanted: Iterable[Obj], existing: Iterable[Obj], changes: list[Change],
                       conflicts: list[str]) -> None:
    have = {(o["metadata"].get("namespace"), _name(o)): o for o in existing}
    for obj in wanted:
        namespace, name = obj["metadata"]["namespace"], _name(obj)
        current = have.get((namespace, name))
        target = obj["spec"]["clusterQueue"]
        if current is None:
            changes.append(Change("create", "LocalQueue", name, namespace, obj, f"queues to {target}"))
        elif (current.get("spec") or {}).get("clusterQueue") != target:
            # Kueue makes spec.clusterQueue immutable, and deleting a queue drops its pending workloads
            conflicts.append(f"LocalQueue {namespace}/{name} queues to {current['spec'].get('clusterQueue')!r}, "
                             f"not {target!r} (Kueue cannot change that in place): delete it when nothing waits "
                             "in it, then sync again")


def plan(desired: Desired, flavors: Iterable[Obj], queues: Iterable[Obj], priority_classes: Iterable[Obj],
         local_queues: Iterable[Obj] = ()) -> Plan:
    """The writes from what exists (``flavors`` ... as listed) to ``desired``, in a safe order.

    Stale flavors and priority classes that gpu-offload made are deleted; ClusterQueues other than the
    desired one and LocalQueues are never deleted (a LocalQueue belongs to its user's namespace).
    """
    changes: list[Change] = []
    conflicts: list[str] = []
    _sync_kind("ResourceFlavor", desired.flavors, flavors, True, changes, conflicts)
    _sync_kind("WorkloadPriorityClass", desired.priority_classes, priority_classes, True, changes, conflicts)
    wanted_queue = _name(desired.cluster_queue)
    _sync_kind("ClusterQueue", [desired.cluster_queue], [q for q in queues if _name(q) == wanted_queue], False,
               changes, conflicts)
    _sync_local_queues(desired.local_queues, local_queues, changes, conflicts)
    ordered = sorted(changes, key=lambda c: _ORDER[(c.verb, c.kind)])
    return Plan(tuple(ordered), tuple(conflicts), desired.warnings)


class QueueApi(Protocol):
    """The API calls a reconcile makes (``queue_client.KueueClient`` over the official client is one)."""

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every object of ``kind`` (cluster-wide, or in ``namespace``)."""
        ...

    def write(self, change: Change) -> None:
        """Carry out one change; a missing object on delete is not an error."""
        ...


def reconcile(api: QueueApi, desired: Desired, dry_run: bool = False) -> Plan:
    """List what exists, plan, and (unless ``dry_run``) write the changes in order; returns the plan.

    A failed write raises (the API error names the object); the changes before it stay, and the next
    reconcile picks up from there.
    """
    namespaces = sorted({q["metadata"]["namespace"] for q in desired.local_queues})
    local = [q for ns in namespaces for q in api.list("LocalQueue", ns)]
    result = plan(desired, api.list("ResourceFlavor"), api.list("ClusterQueue"), api.list("WorkloadPriorityClass"),
                  local)
    if not dry_run:
        for change in result.changes:
            api.write(change)
    return result
