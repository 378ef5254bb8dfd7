"""What Kueue's job reconcilers do to the objects behind a Workload: start them at admission (pods
ungated, a Job unsuspended, both with the flavor's node labels and tolerations), stop them at eviction
(a pod gets the ``TerminationTarget`` condition and is deleted; a Job is suspended), and read their state
(ready, finished, still active)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..apiserver import events
from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.patching import MERGE
from . import names

Obj = dict[str, Any]
_TERMINAL = ("Succeeded", "Failed")


def pods_of(api: Api, workload: Mapping[str, Any]) -> list[Obj]:
    """The pods a pod or pod-group Workload owns (those still present)."""
    pods_rt, ns = api.type("", "v1", "pods"), workload["metadata"]["namespace"]
    out = []
    for ref in workload["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            pod = api.find(pods_rt, ns, ref["name"])
            if pod is not None and pod["metadata"]["uid"] == ref.get("uid"):
                out.append(pod)
    return out


def job_of(api: Api, workload: Mapping[str, Any]) -> Obj | None:
    """The Job a Job Workload belongs to, or None."""
    for ref in workload["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Job":
            return api.find(api.type("batch", "v1", "jobs"), workload["metadata"]["namespace"], ref["name"])
    return None


def job_pods(api: Api, job: Mapping[str, Any]) -> list[Obj]:
    """The pods of a Job (by the controller-uid label the job controller sets)."""
    uid = job["metadata"]["uid"]
    items, _ = api.store.snapshots(("", "pods"), job["metadata"]["namespace"])
    return [p for p in items if (p["metadata"].get("labels") or {}).get("batch.kubernetes.io/controller-uid") == uid]


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Succeeded" or any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL


def pods_ready(api: Api, workload: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady: every pod of the Workload is ready (or succeeded)."""
    wanted = sum(int(ps.get("count", 1)) for ps in workload["spec"]["podSets"])
    job = job_of(api, workload)
    pods = job_pods(api, job) if job is not None else pods_of(api, workload)
    return sum(1 for p in pods if _ready(p) and not p["metadata"].get("deletionTimestamp")) >= wanted


def active(api: Api, workload: Mapping[str, Any]) -> bool:
    """Whether anything of the Workload still runs (its quota cannot be released yet)."""
    job = job_of(api, workload)
    if job is not None:
        return not job["spec"].get("suspend") or any(_live(p) for p in job_pods(api, job))
    return any(_live(p) for p in pods_of(api, workload))


def finished(api: Api, workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the Workload's Finished condition once its pods or Job finished, else None."""
    job = job_of(api, workload)
    if job is not None:
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
                ok = cond["type"] == "Complete"
                return ("Succeeded" if ok else "Failed",
                        "Job finished successfully" if ok else str(cond.get("message", "")))
        return None
    pods = pods_of(api, workload)
    if not pods or any(_live(p) for p in pods):
        return None
    if (workload["metadata"].get("annotations") or {}).get(names.IS_GROUP_ANNOTATION):
        done = sum(1 for p in pods if p["status"]["phase"] == "Succeeded")
        total = sum(int(ps.get("count", 1)) for ps in workload["spec"]["podSets"])
        return ("Succeeded", f"Pods succeeded: {done}/{total}.") if done >= total else None
    phase = pods[0]["status"]["phase"]
    return ("Succeeded" if phase == "Succeeded" else "Failed", str(pods[0]["status"].get("message", "")))


def _scheduling(spec: Mapping[str, Any], flavor: Mapping[str, Any]) -> Obj:
    """The nodeSelector and tolerations of ``spec`` after the flavor's are added (podset.Merge)."""
    fspec = flavor.get("spec") or {}
    selector = {**(spec.get("nodeSelector") or {}), **(fspec.get("nodeLabels") or {})}
    tolerations = list(spec.get("tolerations") or [])
    tolerations += [t for t in fspec.get("tolerations") or [] if t not in tolerations]
    out: Obj = {"tolerations": tolerations}
    if selector:
        out["nodeSelector"] = selector
    return out


def start(api: Api, workload: Mapping[str, Any], flavor: Mapping[str, Any], cluster_queue: str) -> None:
    """Run what the admitted Workload stands for; a ``Started`` event on each pod or the Job."""
    message = f"Admitted by clusterQueue {cluster_queue}"
    job = job_of(api, workload)
    if job is not None:
        template = job["spec"]["template"].get("spec") or {}
        patch = {"spec": {"suspend": False, "template": {"spec": _scheduling(template, flavor)}}}
        with names.raced():
            started = api.patch(api.type("batch", "v1", "jobs"), job["metadata"]["namespace"],
                                job["metadata"]["name"], patch, MERGE)
            events.record(api, started, "Normal", "Started", message, names.COMPONENT)
        return
    pods_rt = api.type("", "v1", "pods")
    for pod in pods_of(api, workload):
        gates = pod["spec"].get("schedulingGates") or []
        if not any(g.get("name") == names.GATE for g in gates):
            continue
        # both of Kueue's gates go: no topology assignment (pod_controller.go ``prepare``)
        spec = {**_scheduling(pod["spec"], flavor),
                "schedulingGates": [g for g in gates if g.get("name") not in (names.GATE, names.TOPOLOGY_GATE)]
                or None}
        with names.raced():
            started = api.patch(pods_rt, pod["metadata"]["namespace"], pod["metadata"]["name"], {"spec": spec},
                                MERGE)
            events.record(api, started, "Normal", "Started", message, names.COMPONENT)


def stop(api: Api, workload: Mapping[str, Any], reason: str, message: str) -> None:
    """Stop what the evicted Workload stands for, as Kueue's ``stopJob`` does; a ``Stopped`` event each."""
    job = job_of(api, workload)
    if job is not None:
        if not job["spec"].get("suspend"):
            with names.raced():
                api.patch(api.type("batch", "v1", "jobs"), job["metadata"]["namespace"], job["metadata"]["name"],
                          {"spec": {"suspend": True}}, MERGE)
                events.record(api, job, "Normal", "Stopped", message, names.COMPONENT)
        return
    pods_rt = api.type("", "v1", "pods")
    for pod in pods_of(api, workload):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or not _live(pod):
            continue
        condition = {"type": names.TERMINATION_TARGET, "status": "True", "lastTransitionTime": now(),
                     "reason": f"WorkloadEvictedDueTo{reason}", "message": message}
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != names.TERMINATION_TARGET] + [condition]
        with names.raced():
            api.patch(pods_rt, meta["namespace"], meta["name"], {"status": {"conditions": conditions}}, MERGE,
                      "status")
            api.delete(pods_rt, meta["namespace"], meta["name"])
            events.record(api, pod, "Normal", "Stopped", message, names.COMPONENT)
