"""The job controller: a batch/v1 Job creates its pods and its status follows theirs.

Pods are created from ``spec.template`` (generateName ``<job>-``, the template's labels, which the server
extended with ``job-name``, ``controller-uid`` and their ``batch.kubernetes.io/`` variants, and an
ownerReference to the Job, so deleting the Job with Background or Foreground propagation removes them).
Status: ``active``, ``ready``, ``succeeded``, ``failed``, ``startTime``, ``completionTime`` and the
conditions ``SuccessCriteriaMet`` + ``Complete`` or ``FailureTarget`` + ``Failed`` (reasons
``BackoffLimitExceeded``, ``DeadlineExceeded``), as Kubernetes 1.36 reports them. ``backoffLimit`` counts
failed pods; ``activeDeadlineSeconds`` runs from ``startTime``; ``ttlSecondsAfterFinished`` deletes a finished
Job (and its pods) after that many seconds. Without ``completions`` (only ``parallelism``, a work queue) the
Job runs ``parallelism`` pods and completes once one succeeded and the others ended. A suspended Job starts no pods and its
active pods are deleted.

``completionMode: Indexed`` as the real controller runs it: each pod gets an index from 0 to completions-1
in the annotation and label ``batch.kubernetes.io/job-completion-index``, a ``JOB_COMPLETION_INDEX`` env
var in every container (a fieldRef to that annotation, as the real controller writes it), the name
``<job>-<index>-<random>`` and, unless the template sets one, the hostname ``<job>-<index>``; at most
``parallelism`` indexes run at once, a failed
index is run again by a new pod, ``status.completedIndexes`` lists the succeeded ones ("0-2,4") and the Job
completes once every index succeeded. Not emulated: pod failure policies, ``backoffLimitPerIndex``,
``successPolicy``, the Suspended condition.

It also holds the admission rules kube-apiserver enforces on Jobs: the pod template's restartPolicy must be
Never or OnFailure, and an Indexed Job must say how many completions it wants.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime, timedelta, timezone
from typing import Any

from dateutil.parser import isoparse

from ..apiserver.admission import AdmissionRequest
from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError, Cause
from ..apiserver.resources import ResourceType
from ..apiserver.selectors import Selector, parse_label_selector

Obj = dict[str, Any]
UID_LABEL = "batch.kubernetes.io/controller-uid"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def restart_policy_rule(req: AdmissionRequest) -> list[Cause]:
    """A Job's pods must not restart forever: restartPolicy Never or OnFailure (422 otherwise)."""
    policy = req.object.get("spec", {}).get("template", {}).get("spec", {}).get("restartPolicy")
    if policy in ("Never", "OnFailure"):
        return []
    return [Cause("FieldValueNotSupported", f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"',
                  "spec.template.spec.restartPolicy")]


def indexed_completions_rule(req: AdmissionRequest) -> list[Cause]:
    """An Indexed Job needs its number of completions, as kube-apiserver requires (422 otherwise)."""
    spec = req.object.get("spec", {})
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        return [Cause("FieldValueRequired", "Required value: when completion mode is Indexed", "spec.completions")]
    return []


def _parse(ts: str | None) -> datetime | None:
    return isoparse(ts) if ts else None


def _finished(job: Obj) -> str:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return ""


def _condition(kind: str, reason: str, message: str) -> Obj:
    stamp = now()
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": stamp, "lastTransitionTime": stamp}


def _owned_pods(api: Api, pods: ResourceType, job: Obj) -> list[Obj]:
    uid = job["metadata"]["uid"]
    sel = Selector(parse_label_selector(f"{UID_LABEL}={uid}"))
    items = api.list(pods, job["metadata"]["namespace"], sel)["items"]
    return [p for p in items if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]


def _pod_for(job: Obj, index: int | None = None) -> Obj:
    template = copy.deepcopy(job["spec"]["template"])
    meta = template.setdefault("metadata", {})
    spec = template.setdefault("spec", {})
    name = job["metadata"]["name"]
    meta.pop("name", None)
    meta["generateName"] = f"{name}-" if index is None else f"{name}-{index}-"
    meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    if index is not None:
        meta.setdefault("annotations", {})[INDEX_KEY] = str(index)
        meta.setdefault("labels", {})[INDEX_KEY] = str(index)
        spec.setdefault("hostname", f"{name}-{index}")
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            env = container.setdefault("env", [])
            if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                    "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _index(pod: Obj) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY, "")
    return int(value) if value.isdigit() else None


def _ranges(indexes: set[int]) -> str:
    """``{0, 1, 2, 4}`` -> ``"0-2,4"``, as status.completedIndexes spells them."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and i - 1 in indexes:
            first = out[-1].split("-")[0]
            out[-1] = f"{first}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def _new_pods(job: Obj, active: list[Obj], succeeded: list[Obj], count: int) -> list[Obj]:
    """The pods to create now: ``count`` more, each with the lowest index neither done nor running."""
    if job["spec"].get("completionMode") != "Indexed":
        return [_pod_for(job) for _ in range(count)]
    taken = {_index(p) for p in [*active, *succeeded]}
    free = [i for i in range(job["spec"].get("completions", 1)) if i not in taken]
    return [_pod_for(job, i) for i in free[:count]]


def _verdict(job: Obj, succeeded: int, failed: int, active: int) -> tuple[str, str, str] | None:
    spec = job["spec"]
    start = _parse(job.get("status", {}).get("startTime"))
    completions = spec.get("completions")
    # for Indexed, ``succeeded`` counts distinct succeeded indexes; a work-queue Job (no completions) is
    # complete once one pod succeeded and none is left running
    if succeeded >= completions if completions is not None else (succeeded and not active):
        return ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
    if failed > spec.get("backoffLimit", 6):
        return ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and start and datetime.now(timezone.utc) >= start + timedelta(seconds=deadline):
        return ("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
    return None


def _finish(api: Api, pods: ResourceType, job: Obj, active: list[Obj], verdict: tuple[str, str, str]) -> None:
    kind, reason, message = verdict
    status = job["status"]
    first = ("SuccessCriteriaMet" if kind == "Complete" else "FailureTarget")
    status["conditions"] = (status.get("conditions") or []) + [
        _condition(first, reason, message), _condition(kind, reason, message)]
    if kind == "Complete":
        status["completionTime"] = now()
    for pod in active:  # a finished job leaves no pod running
        try:
            api.delete(pods, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError as exc:
            if exc.code != 404:
                raise
    status["active"] = 0


def reconcile(api: Api, jobs: ResourceType, pods: ResourceType, job: Obj) -> None:
    """Bring one Job's pods and status in line with its spec (idempotent)."""
    if _finished(job) or job["metadata"].get("deletionTimestamp"):
        return
    if job["spec"].get("suspend"):
        _suspend(api, jobs, pods, job)
        return
    owned = _owned_pods(api, pods, job)
    phase = [p.get("status", {}).get("phase") for p in owned]
    succeeded, failed = phase.count("Succeeded"), phase.count("Failed")
    done = [p for p, ph in zip(owned, phase, strict=True) if ph == "Succeeded"]
    active = [p for p, ph in zip(owned, phase, strict=True)
              if ph not in ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp")]
    status = copy.deepcopy(job.get("status") or {})
    job["status"] = status
    status.setdefault("startTime", now())
    status.update(succeeded=succeeded, failed=failed, uncountedTerminatedPods={},
                  ready=sum(1 for p in active if _ready(p)), active=len(active))
    indexed = job["spec"].get("completionMode") == "Indexed"
    completed = {i for i in map(_index, done) if i is not None}
    if indexed:
        status["completedIndexes"] = _ranges(completed)
    verdict = _verdict(job, len(completed) if indexed else succeeded, failed, len(active))
    if verdict:
        _finish(api, pods, job, active, verdict)
    else:
        spec = job["spec"]
        completions = spec.get("completions")
        if completions is None:  # work queue: parallelism pods until one succeeded, then no new ones
            remaining = 0 if succeeded else spec.get("parallelism", 1)
        else:
            remaining = completions - (len(completed) if indexed else succeeded)
        wanted = min(spec.get("parallelism", 1), remaining) - len(active)
        for pod in _new_pods(job, active, done, max(wanted, 0)):
            api.create(pods, pod, job["metadata"]["namespace"])
            status["active"] += 1
    api.replace(jobs, job["metadata"]["namespace"], job["metadata"]["name"], job, "status")


def _suspend(api: Api, jobs: ResourceType, pods: ResourceType, job: Obj) -> None:
    """A suspended Job has no running pods: the job controller deletes them (how Kueue stops a Job)."""
    active = [p for p in _owned_pods(api, pods, job) if (p.get("status") or {}).get("phase") not in
              ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp")]
    for pod in active:
        try:
            api.delete(pods, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError as exc:
            if exc.code != 404:
                raise
    if active or (job.get("status") or {}).get("active"):
        status = copy.deepcopy(job.get("status") or {})
        status["active"], status["ready"] = 0, 0
        job["status"] = status
        api.replace(jobs, job["metadata"]["namespace"], job["metadata"]["name"], job, "status")


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def _next_wakeup(job: Obj) -> datetime | None:
    status, spec = job.get("status") or {}, job["spec"]
    if _finished(job):
        ttl = spec.get("ttlSecondsAfterFinished")
        done = _parse(status.get("completionTime")) or _parse(
            next((c.get("lastTransitionTime") for c in status.get("conditions") or [] if c["type"] == "Failed"), None))
        return done + timedelta(seconds=ttl) if ttl is not None and done else None
    start, deadline = _parse(status.get("startTime")), spec.get("activeDeadlineSeconds")
    return start + timedelta(seconds=deadline) if start and deadline is not None else None


def _expire(api: Api, jobs: ResourceType, job: Obj) -> None:
    if _finished(job):
        api.delete(jobs, job["metadata"]["namespace"], job["metadata"]["name"], propagation="Background")


def _sweep(api: Api, jobs: ResourceType, pods: ResourceType) -> float | None:
    """Reconcile every Job; returns seconds until the next deadline or TTL (None: none pending)."""
    waits = []
    for job in api.list(jobs)["items"]:
        try:
            wake = _next_wakeup(job)
            if wake and wake <= datetime.now(timezone.utc):
                _expire(api, jobs, job)
            reconcile(api, jobs, pods, api.get(jobs, job["metadata"]["namespace"], job["metadata"]["name"]))
            fresh = api.find(jobs, job["metadata"]["namespace"], job["metadata"]["name"])
            wake = _next_wakeup(fresh) if fresh else None
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise
            continue  # changed under us: the event that changed it triggers another sweep
        if wake:
            waits.append(max((wake - datetime.now(timezone.utc)).total_seconds(), 0.0))
    return min(waits) if waits else None


async def job_controller(api: Api) -> None:
    """Run forever on the server's loop: sweep on every Job or Pod change and at deadlines."""
    jobs, pods = api.type("batch", "v1", "jobs"), api.type("", "v1", "pods")
    sub = api.store.subscribe(None)
    try:
        wait = _sweep(api, jobs, pods)
        while True:
            await sub.next_of((jobs.key, pods.key), wait)
            # coalesce a burst of events into one sweep
            await asyncio.sleep(0)
            wait = _sweep(api, jobs, pods)
    finally:
        sub.close()
