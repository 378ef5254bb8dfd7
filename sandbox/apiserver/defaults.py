"""Server-side fields of new and updated objects: metadata the server owns, and the defaults and status
resets kube-apiserver applies to the kinds the project writes. Pure functions over dicts."""

from __future__ import annotations

import base64
import copy
import ipaddress
import itertools
import random
import re
import uuid
from datetime import datetime, timezone
from typing import Any

from . import crd_defaults
from .errors import Cause
from .resources import ResourceType
from .tolerations import default_tolerations

Obj = dict[str, Any]
# the alphabet Kubernetes uses for generateName suffixes (no vowels, no look-alike digits)
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SERVICE_IPS = (str(ip) for ip in itertools.islice(ipaddress.ip_network("10.96.0.0/12").hosts(), 10, None))
# kinds whose status a create request cannot set (it is reset, as the real strategies do)
_RESET_STATUS = {"Pod": {"phase": "Pending"}, "Job": {}, "Service": {"loadBalancer": {}},
                 "Namespace": {"phase": "Active"}, "PersistentVolumeClaim": {"phase": "Pending"},
                 "PodDisruptionBudget": {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
                                         "expectedPods": 0}}


def now() -> str:
    """RFC 3339 UTC timestamp with seconds, as metadata timestamps are written."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def generate_name(prefix: str) -> str:
    """``prefix`` plus five random characters, as the API server completes ``generateName``."""
    return prefix + "".join(random.choice(_SUFFIX) for _ in range(5))


def name_causes(rt: ResourceType, name: str) -> list[Cause]:
    """Why ``name`` is not a valid object name for ``rt`` (namespaces and services need DNS labels)."""
    label_only = rt.plural in ("namespaces", "services")
    pattern, limit = (_DNS1123_LABEL, 63) if label_only else (_DNS1123_SUBDOMAIN, 253)
    if pattern.match(name) and len(name) <= limit:
        return []
    what = "RFC 1123 label" if label_only else "RFC 1123 subdomain"
    return [Cause("FieldValueInvalid",
                  f'Invalid value: "{name}": a lowercase {what} must consist of lower case alphanumeric '
                  f"characters, '-' or '.', and must start and end with an alphanumeric character "
                  f"(at most {limit} characters)", "metadata.name")]


def _pod_defaults(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        latest = str(container.get("image", "")).endswith(":latest") or ":" not in str(container.get("image", ""))
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("resources", {})
    if spec.get("serviceAccountName") is None:
        spec["serviceAccountName"] = spec.get("serviceAccount") or "default"


def _qos_class(spec: Obj) -> str:
    resources = [c.get("resources") or {} for c in spec.get("containers", [])]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(res) is not None
        and (r.get("requests") or {}).get(res, (r.get("limits") or {}).get(res)) == (r.get("limits") or {}).get(res)
        for r in resources for res in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _job_defaults(job: Obj) -> None:
    spec = job.setdefault("spec", {})
    uid = job["metadata"]["uid"]
    name = job["metadata"]["name"]
    if spec.get("completions") is None and spec.get("parallelism") is None:  # a work-queue Job keeps none
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
              "controller-uid": uid, "job-name": name}
    template = spec.setdefault("template", {})
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    _pod_defaults(template.setdefault("spec", {}))


def on_create(rt: ResourceType, obj: Obj, namespace: str) -> Obj:
    """A copy of ``obj`` with server-owned metadata set and the kind's defaults applied."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    for owned in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink"):
        meta.pop(owned, None)
    if rt.namespaced:
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    meta["generation"] = 1
    out["apiVersion"], out["kind"] = rt.api_version, rt.kind
    if rt.kind in _RESET_STATUS and not rt.custom:
        out["status"] = copy.deepcopy(_RESET_STATUS[rt.kind])
    elif rt.custom and "status" in rt.subresources:
        out.pop("status", None)
    _kind_defaults(rt, out)
    return out


def _kind_defaults(rt: ResourceType, out: Obj) -> None:
    if rt.custom:
        crd_defaults.apply(rt.schema or {}, out)
        return
    if rt.kind == "Pod":
        _pod_defaults(out.setdefault("spec", {}))
        default_tolerations(out["spec"])  # kube-apiserver's DefaultTolerationSeconds admission, on pods only
        out["status"]["qosClass"] = _qos_class(out["spec"])
    elif rt.kind == "Job":
        _job_defaults(out)
    elif rt.kind == "Namespace":
        out["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = out["metadata"]["name"]
        out.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    elif rt.kind == "Secret":
        out.setdefault("type", "Opaque")
        string_data = out.pop("stringData", None) or {}
        if string_data:
            data = out.setdefault("data", {}) or {}
            data.update({k: base64.b64encode(v.encode()).decode() for k, v in string_data.items()})
            out["data"] = data
    elif rt.kind == "Service":
        spec = out.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("clusterIP") is None:
            spec["clusterIP"] = next(_SERVICE_IPS)
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        service_port_defaults(spec)
    elif rt.kind == "Node":
        node_omitted(out.get("spec") or {})


def node_omitted(spec: Obj) -> None:
    """A Node's ``spec.unschedulable`` is a Go bool with ``omitempty``: kube-apiserver never stores ``false``, so
    an uncordoned node reads back as one never cordoned."""
    if spec.get("unschedulable") is False:
        del spec["unschedulable"]


def service_port_defaults(spec: Obj) -> None:
    """What kube-apiserver fills into a Service's spec on create and update, beyond its cluster IPs: each
    port's protocol TCP and targetPort = port, one IPv4 family, and Cluster traffic policies. Left out:
    nodePort allocation for NodePort and LoadBalancer Services."""
    if spec.get("type", "ClusterIP") != "ExternalName":
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec.get("type") in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            if "port" in port:
                port.setdefault("targetPort", port["port"])


def spec_changed(old: Obj, new: Obj) -> bool:
    """Whether anything besides metadata and status changed (what bumps ``metadata.generation``)."""
    skip = ("metadata", "status")
    return {k: v for k, v in old.items() if k not in skip} != {k: v for k, v in new.items() if k not in skip}


POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def pod_update_causes(old_spec: Obj, new_spec: Obj) -> list[Cause]:
    """Pod specs are immutable apart from images, tolerations (added) and a few fields, as on a real
    server; ``spec.nodeName`` is set through the binding subresource."""
    # a gated pod's scheduling directives may change until its gates are gone (KEP-3838, GA in 1.30):
    # gates only removed, nodeSelector only added to, affinity only set (the sandbox does not check
    # that a changed affinity narrows the old one)
    gated = ("schedulingGates", "nodeSelector", "affinity") if old_spec.get("schedulingGates") else ()

    def masked(spec: Obj) -> Obj:
        out = {k: v for k, v in spec.items() if k not in POD_MUTABLE + gated}
        for key in ("containers", "initContainers"):
            out[key] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(key, [])]
        return out

    causes = []
    if masked(old_spec) != masked(new_spec):
        causes.append(Cause("FieldValueForbidden",
                            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                            "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                            "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds`",
                            "spec"))
    if gated and any(g not in (old_spec.get("schedulingGates") or []) for g in new_spec.get("schedulingGates") or []):
        causes.append(Cause("FieldValueForbidden", "Forbidden: only deletion is allowed, but found new scheduling "
                            "gate", "spec.schedulingGates"))
    old_sel, new_sel = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
    if gated and any(new_sel.get(k) != v for k, v in old_sel.items()):
        causes.append(Cause("FieldValueForbidden", "Forbidden: only additions to spec.nodeSelector are allowed "
                            "(no mutations or deletions)", "spec.nodeSelector"))
    old_tols = old_spec.get("tolerations") or []
    if any(t not in (new_spec.get("tolerations") or []) for t in old_tols):
        causes.append(Cause("FieldValueForbidden", "Forbidden: existing toleration can not be modified",
                            "spec.tolerations"))
    return causes


_IMMUTABLE = "field is immutable"


_JOB_SCHEDULING = ("nodeSelector", "tolerations", "affinity", "schedulingGates")


def _job_field(spec: Obj, field: str, old_job: Obj) -> Any:
    """A Job field as the immutability check compares it: a suspended Job that never started may change
    its template's scheduling directives, labels and annotations (Kubernetes 1.27+), as Kueue does when it
    admits a Job."""
    value = spec.get(field)
    never_started = (old_job.get("spec") or {}).get("suspend") and not (old_job.get("status") or {}).get("startTime")
    if field != "template" or not never_started or not isinstance(value, dict):
        return value
    template = {k: v for k, v in value.items() if k != "metadata"}
    template["spec"] = {k: v for k, v in (value.get("spec") or {}).items() if k not in _JOB_SCHEDULING}
    return template


def update_causes(rt: ResourceType, old: Obj, new: Obj) -> list[Cause]:
    """What an update may not change, as the real strategies enforce it: pod specs (see
    ``pod_update_causes``), a Job's template, selector and completions, and the data of a Secret or
    ConfigMap marked ``immutable``."""
    if rt.custom:
        return []
    if rt.kind == "Pod":
        return pod_update_causes(old.get("spec", {}), new.get("spec", {}))
    if rt.kind == "Job":
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        return [Cause("FieldValueInvalid", f"Invalid value: {_IMMUTABLE}", f"spec.{field}")
                for field in ("template", "selector", "completions")
                if _job_field(old_spec, field, old) != _job_field(new_spec, field, old)]
    if rt.kind in ("Secret", "ConfigMap") and old.get("immutable"):
        return [Cause("FieldValueForbidden", f"Forbidden: {_IMMUTABLE} when `immutable` is set", field)
                for field in ("data", "binaryData", "immutable") if old.get(field) != new.get(field)]
    return []
