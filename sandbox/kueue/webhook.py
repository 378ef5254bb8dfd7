"""Kueue's pod and Job webhooks (pkg/controller/jobs/pod/pod_webhook.go, jobframework's base webhook).

A pod or batch/v1 Job is Kueue's when its namespace matches ``managedJobsNamespaceSelector`` and it has a
``kueue.x-k8s.io/queue-name`` label (the sandbox emulates ``manageJobsWithoutQueueName: false``, Kueue's
default). Such a pod gets the ``kueue.x-k8s.io/managed=true`` label and the ``kueue.x-k8s.io/admission``
scheduling gate; such a Job is created suspended. A pod owned by a Job Kueue manages is left alone (its
Job's Workload covers it). A managed pod of a group must carry both the group label and a valid
``kueue.x-k8s.io/pod-group-total-count`` annotation, or it is refused (422) as by Kueue's validating webhook.
Not emulated: the ``kueue.x-k8s.io/managed`` finalizer Kueue also puts on pods
(it only delays a pod's removal until Kueue has accounted for it), default LocalQueues.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..apiserver.admission import AdmissionRequest
from ..apiserver.api import Api
from ..apiserver.errors import Cause
from ..apiserver.matching import _requirement_matches
from . import names

DEFAULT_NAMESPACE_SELECTOR: Mapping[str, Any] = {
    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                          "values": ["kube-system", "kueue-system"]}]}
"""Kueue's default ``managedJobsNamespaceSelector`` (config/components/manager/controller_manager_config)."""


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions, all ANDed; empty matches everything."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_requirement_matches(r, labels.get(r["key"])) for r in selector.get("matchExpressions") or [])


def _managed_namespace(api: Api, namespace: str, selector: Mapping[str, Any]) -> bool:
    ns = api.find(api.type("", "v1", "namespaces"), "", namespace)
    return ns is not None and label_selector_matches(selector, ns["metadata"].get("labels") or {})


def _owned_by_job(obj: Mapping[str, Any]) -> bool:
    return any(ref.get("kind") == "Job" and ref.get("apiVersion") == "batch/v1"
               for ref in obj["metadata"].get("ownerReferences") or [])


def mutate_pod(pod: dict[str, Any]) -> None:
    """What Kueue's pod webhook does to a pod it manages (pure, in place)."""
    pod["metadata"].setdefault("labels", {})[names.MANAGED_LABEL] = "true"
    gates = pod.setdefault("spec", {}).setdefault("schedulingGates", [])
    if not any(g.get("name") == names.GATE for g in gates):
        gates.append({"name": names.GATE})


def group_causes(pod: Mapping[str, Any]) -> list[Cause]:
    """Kueue's ``validatePodGroupMetadata``: the group label and the total-count annotation go together,
    and the count is a whole number above zero."""
    meta = pod["metadata"]
    group = (meta.get("labels") or {}).get(names.GROUP_NAME_LABEL)
    count = (meta.get("annotations") or {}).get(names.GROUP_TOTAL_ANNOTATION)
    both = (f"Required value: both the '{names.GROUP_TOTAL_ANNOTATION}' annotation and the "
            f"'{names.GROUP_NAME_LABEL}' label should be set")
    if group is None and count is None:
        return []
    if group is None:
        return [Cause("FieldValueRequired", both, f"metadata.labels[{names.GROUP_NAME_LABEL}]")]
    path = f"metadata.annotations[{names.GROUP_TOTAL_ANNOTATION}]"
    if count is None:
        return [Cause("FieldValueRequired", both, path)]
    if not count.isdigit() or int(count) < 1:
        return [Cause("FieldValueInvalid", f'Invalid value: "{count}": incorrect annotation value '
                      f"'{names.GROUP_TOTAL_ANNOTATION}={count}': group total count should be a whole number "
                      "greater than zero", path)]
    return []


def priority_class_causes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[Cause]:
    """jobframework's ``ValidateUpdateForWorkloadPriorityClassName``: a running (ungated) pod's priority-class
    label may change from one class to another, but not be added; it may never be removed."""
    if old is None:
        return []
    path = f"metadata.labels[{names.PRIORITY_LABEL}]"
    before = (old["metadata"].get("labels") or {}).get(names.PRIORITY_LABEL)
    after = (new["metadata"].get("labels") or {}).get(names.PRIORITY_LABEL)
    suspended = any(g.get("name") == names.GATE for g in (new.get("spec") or {}).get("schedulingGates") or [])
    if before and not after:
        return [Cause("FieldValueInvalid", 'Invalid value: "": WorkloadPriorityClass cannot be removed from a '
                      "workload", path)]
    if after and not before and not suspended:
        return [Cause("FieldValueInvalid", f'Invalid value: "{after}": WorkloadPriorityClass cannot be added to a '
                      "non-suspended workload", path)]
    return []


def install(api: Api, namespace_selector: Mapping[str, Any] = DEFAULT_NAMESPACE_SELECTOR) -> None:
    """Register the pod and Job webhooks on ``api``."""
    def pod_hook(req: AdmissionRequest) -> None:
        pod = req.object
        if not (pod["metadata"].get("labels") or {}).get(names.QUEUE_LABEL) or _owned_by_job(pod):
            return
        if _managed_namespace(api, req.namespace, namespace_selector):
            mutate_pod(pod)

    def job_hook(req: AdmissionRequest) -> None:
        job = req.object
        if (job["metadata"].get("labels") or {}).get(names.QUEUE_LABEL) and _managed_namespace(
                api, req.namespace, namespace_selector):
            job.setdefault("spec", {})["suspend"] = True

    def pod_check(req: AdmissionRequest) -> list[Cause]:
        labels = req.object["metadata"].get("labels") or {}
        if labels.get(names.MANAGED_LABEL) != "true":
            return []
        return group_causes(req.object) + priority_class_causes(req.old_object, req.object)

    api.admission.add_mutating("pods", pod_hook, ("CREATE",))
    api.admission.add_validating("pods", pod_check, ("CREATE", "UPDATE"))
    api.admission.add_mutating("jobs.batch", job_hook, ("CREATE",))
