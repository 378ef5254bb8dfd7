"""Pure builders of Kueue Workloads for what Kueue's job reconcilers manage: a pod, a pod group, a Job.

Names as jobframework/workload_names.go makes them: ``<kind>-<owner name>-<first 5 hex of
sha1(kind, group, name, uid)>``, except a pod group's Workload, named after the group. Pod sets as
pkg/controller/jobs/pod and jobs/job build them: one ``main`` pod set of count 1 for a pod, one per
distinct pod role for a group (the sandbox's role is a hash of the containers and scheduling fields,
Kueue's hashes a few more), and ``main`` with ``parallelism`` pods for a Job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from ..apiserver.store import clone
from ..controllers.scheduler import pod_requests
from . import names

Obj = dict[str, Any]
_MAX_PREFIX = 253 - 1 - 5


def workload_name(kind: str, group: str, owner: str, uid: str) -> str:
    """``GetWorkloadNameForOwnerWithGVK``."""
    digest = hashlib.sha1("\n".join((kind, group, owner, uid)).encode()).hexdigest()[:5]
    return f"{(kind.lower() + '-' + owner)[:_MAX_PREFIX]}-{digest}"


def _owner_ref(obj: Mapping[str, Any], api_version: str, kind: str) -> Obj:
    meta = obj["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _workload(name: str, namespace: str, queue: str, pod_sets: list[Obj], priority: tuple[str, int] | None,
              owners: list[Obj], job_uid: str) -> Obj:
    spec: Obj = {"queueName": queue, "podSets": pod_sets, "active": True}
    if priority is not None:
        spec["priorityClassRef"] = {"group": names.GROUP, "kind": "WorkloadPriorityClass", "name": priority[0]}
        spec["priority"] = priority[1]
    return {"apiVersion": names.API_VERSION, "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace, "labels": {names.JOB_UID_LABEL: job_uid},
                         "ownerReferences": owners, "finalizers": [names.IN_USE_FINALIZER]},
            "spec": spec}


def _template(pod_spec: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Obj:
    spec = {k: v for k, v in clone(dict(pod_spec)).items() if k not in ("nodeName",)}
    template: Obj = {"spec": spec}
    if labels:
        template["metadata"] = {"labels": dict(labels)}
    return template


def for_pod(pod: Mapping[str, Any], priority: tuple[str, int] | None) -> Obj:
    """The Workload of a plain pod: one pod set ``main`` of count 1."""
    meta = pod["metadata"]
    name = workload_name("Pod", "", meta["name"], meta["uid"])
    pod_set = {"name": "main", "count": 1, "template": _template(pod["spec"])}
    return _workload(name, meta["namespace"], meta["labels"][names.QUEUE_LABEL], [pod_set], priority,
                     [_owner_ref(pod, "v1", "Pod")], meta["uid"])


def role_of(pod: Mapping[str, Any]) -> str:
    """The sandbox's pod role hash: pods of a group with equal containers and placement share a pod set."""
    spec = pod.get("spec") or {}
    shape = {k: spec.get(k) for k in ("containers", "initContainers", "nodeSelector", "tolerations", "affinity")}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]


def for_group(group: str, pods: Iterable[Mapping[str, Any]], priority: tuple[str, int] | None) -> Obj:
    """The Workload of a pod group: named after the group, one pod set per role, owned by every pod."""
    members = sorted(pods, key=lambda p: p["metadata"]["name"])
    roles: dict[str, Obj] = {}
    for pod in members:
        role = role_of(pod)
        if role in roles:
            roles[role]["count"] += 1
        else:
            roles[role] = {"name": role, "count": 1, "template": _template(pod["spec"])}
    first = members[0]["metadata"]
    wl = _workload(group, first["namespace"], first["labels"][names.QUEUE_LABEL],
                   [roles[r] for r in sorted(roles)], priority, [_owner_ref(p, "v1", "Pod") for p in members],
                   group)
    wl["metadata"]["annotations"] = {names.IS_GROUP_ANNOTATION: "true"}
    return wl


def for_job(job: Mapping[str, Any], priority: tuple[str, int] | None) -> Obj:
    """The Workload of a batch/v1 Job: pod set ``main`` with ``parallelism`` pods."""
    meta, spec = job["metadata"], job["spec"]
    count = min(int(spec.get("parallelism", 1)), int(spec.get("completions", spec.get("parallelism", 1))))
    template = spec["template"]
    pod_set = {"name": "main", "count": count,
               "template": _template(template.get("spec") or {}, (template.get("metadata") or {}).get("labels"))}
    return _workload(workload_name("Job", "batch", meta["name"], meta["uid"]), meta["namespace"],
                     meta["labels"][names.QUEUE_LABEL], [pod_set], priority,
                     [_owner_ref(job, "batch/v1", "Job")], meta["uid"])


def requests(workload: Mapping[str, Any], excluded: tuple[str, ...] = ()) -> dict[str, Decimal]:
    """What the Workload asks for in total: each pod set's pod requests times its count, without the resources
    whose names start with one of ``excluded`` (Kueue's ``resources.excludeResourcePrefixes``)."""
    total: dict[str, Decimal] = {}
    for pod_set in workload["spec"]["podSets"]:
        for resource, value in pod_requests(pod_set["template"]).items():
            if resource.startswith(excluded):
                continue
            total[resource] = total.get(resource, Decimal(0)) + value * int(pod_set.get("count", 1))
    return total


def priority(workload: Mapping[str, Any]) -> int:
    """The Workload's priority (0 without a priority class, as Kueue's default)."""
    return int(workload["spec"].get("priority", 0))
