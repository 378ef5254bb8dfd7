"""Kueue's pod and Job webhooks (pkg/controller/jobs/pod/pod_webhook.go, jobframework's base webhook).

A pod or batch/v1 Job is Kueue's when its namespace matches ``managedJobsNamespaceSelector`` and it has a
``kueue.x-k8s.io/queue-name`` label (the sandbox emulates ``manageJobsWithoutQueueName: false``, Kueue's
default). Such a pod gets the ``kueue.x-k8s.io/managed=true`` label, the ``kueue.x-k8s.io/managed`` finalizer
and the scheduling gates ``kueue.x-k8s.io/admission`` and ``kueue.x-k8s.io/topology`` (Kueue 0.19's
``PodWebhook.Default``); such a Job is created suspended. A pod owned by a Job Kueue manages is left alone
(its Job's Workload covers it). A managed pod of a group must carry both the group label and a valid
``kueue.x-k8s.io/pod-group-total-count`` annotation, or it is refused (422) as by Kueue's validating webhook.
ClusterQueues and ResourceFlavors get the ``kueue.x-k8s.io/resource-in-use`` finalizer (their webhooks).

The webhooks fail closed (``failurePolicy: Fail``): while Kueue is down (``Outage``) the API server refuses
every pod create and update in a managed namespace (queued or not), every Job write there and every write
of a ClusterQueue, ResourceFlavor or Workload, with kube-apiserver's 500 "failed calling webhook". LocalQueues
have no webhook. Not emulated: the role-hash annotation (Kueue's exact hash), default LocalQueues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..apiserver.admission import AdmissionRequest
from ..apiserver.api import Api
from ..apiserver.errors import ApiError, Cause
from ..apiserver.matching import label_selector_matches
from . import names

DEFAULT_NAMESPACE_SELECTOR: Mapping[str, Any] = {
    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                          "values": ["kube-system", "kueue-system"]}]}
"""Kueue's default ``managedJobsNamespaceSelector`` (config/components/manager/controller_manager_config)."""


def _managed_namespace(api: Api, namespace: str, selector: Mapping[str, Any]) -> bool:
    ns = api.find(api.type("", "v1", "namespaces"), "", namespace)
    return ns is not None and label_selector_matches(selector, ns["metadata"].get("labels") or {})


def _owned_by_job(obj: Mapping[str, Any]) -> bool:
    return any(ref.get("kind") == "Job" and ref.get("apiVersion") == "batch/v1"
               for ref in obj["metadata"].get("ownerReferences") or [])


def mutate_pod(pod: dict[str, Any]) -> None:
    """What Kueue's pod webhook does to a pod it manages (pure, in place)."""
    meta = pod["metadata"]
    meta.setdefault("labels", {})[names.MANAGED_LABEL] = "true"
    if names.POD_FINALIZER not in meta.setdefault("finalizers", []):
        meta["finalizers"].append(names.POD_FINALIZER)
    gates = pod.setdefault("spec", {}).setdefault("schedulingGates", [])
    for gate in (names.GATE, names.TOPOLOGY_GATE):
        if not any(g.get("name") == gate for g in gates):
            gates.append({"name": gate})


def add_in_use_finalizer(req: AdmissionRequest) -> None:
    """The ClusterQueue and ResourceFlavor webhooks' ``Default``: Kueue's in-use finalizer."""
    finalizers = req.object["metadata"].setdefault("finalizers", [])
    if names.IN_USE_FINALIZER not in finalizers:
        finalizers.append(names.IN_USE_FINALIZER)


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


class Outage:
    """Whether the sandbox's Kueue is down (its process gone): webhooks refuse, the controller stands still."""

    def __init__(self) -> None:
        self.down = False


WEBHOOK_URL = "https://kueue-webhook-service.kueue-system.svc:443"
WEBHOOK_ADDRESS = "127.0.0.1:9443"
"""Where the API server would dial Kueue's webhook: Kueue's default webhook port (the sandbox has no process)."""


def refused(webhook: str, path: str) -> ApiError:
    """kube-apiserver's answer when a webhook with ``failurePolicy: Fail`` cannot be reached, in its words."""
    cause = (f'failed calling webhook "{webhook}": failed to call webhook: Post "{WEBHOOK_URL}{path}?timeout=10s": '
             f"dial tcp {WEBHOOK_ADDRESS}: connect: connection refused")
    return ApiError(500, "InternalError", f"Internal error occurred: {cause}", causes=(Cause("", cause),))


def install(api: Api, selector: Callable[[], Mapping[str, Any]] = lambda: DEFAULT_NAMESPACE_SELECTOR,
            outage: Outage | None = None) -> None:
    """Register the pod, Job, ClusterQueue, ResourceFlavor and Workload webhooks on ``api``; ``selector()`` is
    Kueue's ``managedJobsNamespaceSelector`` as configured now (a restarted Kueue may have another)."""
    state = outage or Outage()

    def reachable(webhook: str, path: str, namespace: str | None = None) -> bool:
        """False when the webhook is not called at all (namespace not selected); raises while Kueue is down."""
        if namespace is not None and not _managed_namespace(api, namespace, selector()):
            return False
        if state.down:
            raise refused(webhook, path)
        return True

    def pod_hook(req: AdmissionRequest) -> None:
        if not reachable("mpod.kb.io", "/mutate--v1-pod", req.namespace):
            return
        pod = req.object
        if (pod["metadata"].get("labels") or {}).get(names.QUEUE_LABEL) and not _owned_by_job(pod):
            mutate_pod(pod)

    def job_hook(req: AdmissionRequest) -> None:
        if reachable("mjob.kb.io", "/mutate-batch-v1-job", req.namespace) and (
                req.object["metadata"].get("labels") or {}).get(names.QUEUE_LABEL):
            req.object.setdefault("spec", {})["suspend"] = True

    def pod_check(req: AdmissionRequest) -> list[Cause]:
        if not reachable("vpod.kb.io", "/validate--v1-pod", req.namespace):
            return []
        labels = req.object["metadata"].get("labels") or {}
        if labels.get(names.MANAGED_LABEL) != "true":
            return []
        return group_causes(req.object) + priority_class_causes(req.old_object, req.object)

    def job_check(req: AdmissionRequest) -> list[Cause]:
        reachable("vjob.kb.io", "/validate-batch-v1-job", req.namespace)
        return []

    def kueue_kind(webhook: str, path: str, default: Any = None) -> Any:
        def hook(req: AdmissionRequest) -> None:
            reachable(webhook, path)
            if default is not None:
                default(req)
        return hook

    api.admission.add_mutating("pods", pod_hook, ("CREATE",))
    api.admission.add_validating("pods", pod_check, ("CREATE", "UPDATE"))
    api.admission.add_mutating("jobs.batch", job_hook, ("CREATE",))
    api.admission.add_validating("jobs.batch", job_check, ("CREATE", "UPDATE"))
    for plural, kind in (("clusterqueues", "clusterqueue"), ("resourceflavors", "resourceflavor")):
        path = f"/mutate-kueue-x-k8s-io-v1beta2-{kind}"
        api.admission.add_mutating(f"{plural}.{names.GROUP}", kueue_kind(f"m{kind}.kb.io", path, add_in_use_finalizer),
                                   ("CREATE",))
        api.admission.add_validating(f"{plural}.{names.GROUP}", kueue_kind(
            f"v{kind}.kb.io", f"/validate-kueue-x-k8s-io-v1beta2-{kind}"), ("CREATE", "UPDATE"))
    api.admission.add_mutating(f"workloads.{names.GROUP}", kueue_kind(
        "mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload"), ("CREATE",))
    api.admission.add_validating(f"workloads.{names.GROUP}", kueue_kind(
        "vworkload.kb.io", "/validate-kueue-x-k8s-io-v1beta2-workload"), ("CREATE", "UPDATE"))
    api.admission.add_validating(f"workloads.{names.GROUP}/status", kueue_kind(
        "vworkload.kb.io", "/validate-kueue-x-k8s-io-v1beta2-workload"), ("UPDATE",))
