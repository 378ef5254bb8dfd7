"""Kueue's job reconcilers, Workload side: one Workload per managed pod, pod group or Job, created when its
owner appears (a pod group once ``pod-group-total-count`` pods exist), marked Finished when the owner
finishes. The ``kueue.x-k8s.io/priority-class`` label names a WorkloadPriorityClass whose value becomes
the Workload's priority; an unknown class leaves the owner without a Workload and a warning event, as
Kueue's ``WorkloadPriorityClassNotFound``. A managed pod's label changed from one class to another (Kueue's
webhook refuses adding or removing it once the pod runs) moves its Workload's priority with it, as
jobframework's ``UpdateWorkloadPriority`` does (Kueue v0.15 on); the sandbox follows single pods only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..apiserver import events
from ..apiserver.api import Api
from ..apiserver.patching import MERGE
from . import names, owners, workloads

Obj = dict[str, Any]


class PriorityNotFound(LookupError):
    """The priority-class label names no WorkloadPriorityClass."""


def _priority(api: Api, obj: Mapping[str, Any]) -> tuple[str, int] | None:
    name = (obj["metadata"].get("labels") or {}).get(names.PRIORITY_LABEL)
    if not name:
        return None
    wpc = api.find(api.kind(names.API_VERSION, "WorkloadPriorityClass"), "", name)
    if wpc is None:
        raise PriorityNotFound(name)
    return name, int(wpc["value"])


def _create(api: Api, owner: Mapping[str, Any], build: Any, created: list[str]) -> None:
    wl_rt = api.kind(names.API_VERSION, "Workload")
    try:
        body = build(_priority(api, owner))
    except PriorityNotFound as exc:
        events.record(api, owner, "Warning", "WorkloadPriorityClassNotFound",
                      f'WorkloadPriorityClass "{exc}" not found: create it or fix the '
                      f"{names.PRIORITY_LABEL} label", names.COMPONENT)
        return
    meta = body["metadata"]
    if api.find(wl_rt, meta["namespace"], meta["name"]) is not None:
        return
    with names.raced():
        created.append(api.create(wl_rt, body, meta["namespace"])["metadata"]["uid"])
        events.record(api, owner, "Normal", "CreatedWorkload",
                      f"Created Workload: {meta['namespace']}/{meta['name']}", names.COMPONENT)


def _managed(obj: Mapping[str, Any]) -> bool:
    return not obj["metadata"].get("deletionTimestamp") and (obj.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


def _arrival(obj: Mapping[str, Any]) -> tuple[str, int]:
    # creationTimestamp has whole seconds; a pod or Job freshly created has not been written since, so
    # its resourceVersion orders those of the same second by creation
    meta = obj["metadata"]
    return str(meta.get("creationTimestamp", "")), int(meta.get("resourceVersion", 0))


def ensure_workloads(api: Api, managed_job_namespaces: set[str]) -> list[str]:
    """Create the missing Workloads of managed pods, pod groups and Jobs, in their owners' creation order;
    returns the uids of those created, in that order."""
    wl_rt = api.kind(names.API_VERSION, "Workload")
    pods, _ = api.store.snapshots(("", "pods"))
    created: list[str] = []
    groups: dict[tuple[str, str], list[Obj]] = {}
    for pod in sorted(pods, key=_arrival):
        labels = pod["metadata"].get("labels") or {}
        # the webhook sets the managed label only with a queue label, but a user may set it by hand
        if labels.get(names.MANAGED_LABEL) != "true" or not labels.get(names.QUEUE_LABEL) or not _managed(pod):
            continue
        group = labels.get(names.GROUP_NAME_LABEL)
        if group:
            groups.setdefault((pod["metadata"]["namespace"], group), []).append(pod)
            continue
        name = workloads.workload_name("Pod", "", pod["metadata"]["name"], pod["metadata"]["uid"])
        if api.find(wl_rt, pod["metadata"]["namespace"], name) is None:
            _create(api, pod, lambda prio, pod=pod: workloads.for_pod(pod, prio), created)
    for (namespace, group), members in groups.items():
        total = int(members[0]["metadata"]["annotations"][names.GROUP_TOTAL_ANNOTATION])  # checked at admission
        if len(members) >= total and api.find(wl_rt, namespace, group) is None:
            _create(api, members[0], lambda prio, g=group, m=members: workloads.for_group(g, m, prio), created)
    jobs, _ = api.store.snapshots(("batch", "jobs"))
    for job in sorted(jobs, key=_arrival):
        meta = job["metadata"]
        if not (meta.get("labels") or {}).get(names.QUEUE_LABEL) or meta["namespace"] not in managed_job_namespaces:
            continue
        name = workloads.workload_name("Job", "batch", meta["name"], meta["uid"])
        if not meta.get("deletionTimestamp") and api.find(wl_rt, meta["namespace"], name) is None:
            _create(api, job, lambda prio, job=job: workloads.for_job(job, prio), created)
    return created


def follow_priorities(api: Api) -> list[str]:
    """Give each single managed pod's Workload the priority of the class its label names now; returns the
    Workloads changed (``namespace/name``)."""
    wl_rt = api.kind(names.API_VERSION, "Workload")
    pods, _ = api.store.snapshots(("", "pods"))
    changed: list[str] = []
    for pod in pods:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        wanted = labels.get(names.PRIORITY_LABEL)
        if labels.get(names.MANAGED_LABEL) != "true" or labels.get(names.GROUP_NAME_LABEL) or not wanted:
            continue
        name = workloads.workload_name("Pod", "", meta["name"], meta["uid"])
        wl = api.find(wl_rt, meta["namespace"], name)
        ref = ((wl or {}).get("spec") or {}).get("priorityClassRef") or {}
        if wl is None or not ref.get("name") or ref["name"] == wanted:
            continue  # no Workload yet, or one without a class (Kueue leaves those), or already there
        try:
            priority = _priority(api, pod)
        except PriorityNotFound:
            continue  # the label names no class: the Workload keeps its priority
        assert priority is not None
        with names.raced():
            api.patch(wl_rt, meta["namespace"], name, {"spec": {"priorityClassRef": {**ref, "name": priority[0]},
                                                                "priority": priority[1]}}, MERGE)
            events.record(api, pod, "Normal", "UpdatedWorkload",
                          f"Updated workload priority class: {meta['namespace']}/{name}", names.COMPONENT)
            changed.append(f"{meta['namespace']}/{name}")
    return changed


def mark_finished(api: Api, workload: Mapping[str, Any]) -> bool:
    """Set Finished once the owner finished (and release the quota); True if it did."""
    if names.is_true(workload, names.FINISHED):
        return False
    verdict = owners.finished(api, workload)
    if verdict is None:
        return False
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    names.set_condition(conditions, names.condition(names.FINISHED, True, verdict[0], verdict[1],
                                                    workload["metadata"].get("generation")))
    meta = workload["metadata"]
    with names.raced():
        api.patch(api.kind(names.API_VERSION, "Workload"), meta["namespace"], meta["name"],
                  {"status": {"conditions": conditions}}, MERGE, "status")
    return True
