"""Kueue's names, as its API and controllers spell them (kueue v0.20 line, apis/kueue/v1beta2 and
pkg/controller/jobs/pod), and the condition helper its controllers use (apimeta.SetStatusCondition)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..apiserver.defaults import now
from ..apiserver.errors import ApiError

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")
"""Kueue's visibility server serves the same storage under both versions (pkg/visibility/server.go)."""

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
GATE = "kueue.x-k8s.io/admission"
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
"""The second gate Kueue's pod webhook adds (TopologyAwareScheduling, on by default since 0.14); removed at
admission when the Workload got no topology assignment (pod_controller.go ``prepare``)."""
POD_FINALIZER = "kueue.x-k8s.io/managed"
"""Kueue's finalizer on the pods it manages (podconstants.PodFinalizer): a deleted pod stays Terminating until
Kueue has accounted for it."""
IN_USE_FINALIZER = "kueue.x-k8s.io/resource-in-use"
"""Kueue's finalizer on Workloads, ClusterQueues and ResourceFlavors (ResourceInUseFinalizerName)."""
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
IS_GROUP_ANNOTATION = "kueue.x-k8s.io/is-group-workload"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
COMPONENT = "kueue-admission"
"""Kueue's event recorder name for the scheduler and the job reconcilers."""

QUOTA_RESERVED = "QuotaReserved"
PENDING = "Pending"
"""The reason of QuotaReserved=False (and of its Warning event) for every Workload Kueue 0.19 could not admit, with
its UnadmittedWorkloadsObservability gate off, as by default: the granular reasons (WaitingForQuota,
ExceedsMaxQuota, ...) come only with that Beta gate on. The message says which case it is."""
INADMISSIBLE = "Inadmissible"
"""The reason for a Workload whose queue cannot admit anything (a missing or stopped LocalQueue or ClusterQueue),
with that gate off (it would say Misconfigured)."""
ADMITTED = "Admitted"
FINISHED = "Finished"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"
PODS_READY = "PodsReady"
TERMINATION_TARGET = "TerminationTarget"
"""The pod condition Kueue writes before deleting a pod it stops (pod_controller.go)."""

IN_CLUSTER_QUEUE = "InClusterQueue"
PODS_READY_TIMEOUT = "PodsReadyTimeout"

WORKLOADS = ("kueue.x-k8s.io", "workloads")


def condition(type_: str, status: bool, reason: str, message: str, generation: int | None = None) -> dict[str, Any]:
    """A metav1.Condition; Kueue truncates messages to 32 KiB, the sandbox's never get near it."""
    cond: dict[str, Any] = {"type": type_, "status": "True" if status else "False", "reason": reason,
                            "message": message, "lastTransitionTime": now()}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def set_condition(conditions: list[dict[str, Any]], new: Mapping[str, Any]) -> bool:
    """apimeta.SetStatusCondition: replace by type, keeping lastTransitionTime unless the status changes."""
    for i, old in enumerate(conditions):
        if old.get("type") == new["type"]:
            merged = dict(new)
            if old.get("status") == new["status"]:
                merged["lastTransitionTime"] = old.get("lastTransitionTime", new["lastTransitionTime"])
            if merged == old:
                return False
            conditions[i] = merged
            return True
    conditions.append(dict(new))
    return True


def find(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_`` in ``obj.status.conditions``, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond  # type: ignore[no-any-return]
    return None


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    """Whether ``obj`` has condition ``type_`` with status True."""
    cond = find(obj, type_)
    return cond is not None and cond.get("status") == "True"


@contextmanager
def raced() -> Iterator[None]:
    """Ignore a write that lost a race (the object is gone, 404, or changed meanwhile, 409): the event that
    caused it brings another pass. Anything else (a 422 from the CRD's schema) is a bug and propagates."""
    try:
        yield
    except ApiError as exc:
        if exc.code not in (404, 409):
            raise
