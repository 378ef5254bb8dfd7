"""Schema validators and realistic API objects (shaped as the API server returns them) for liqo_peering, and
the sandbox origin its end-to-end modules share."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ..origins import PEERED, TWO_MODELS

CRDS = Path(__file__).resolve().parents[2] / ".." / "shared" / "liqo-crds"
K8S_VERSION = "1.36"
Obj = dict[str, Any]
DONORS = TWO_MODELS
# The session's origin of these donors with the real Liqo CRDs, shared with the kube backend's tests and the panel's
# (tests/origins.py), for every module here that does not bring its own (test_sandbox_queues: three donors, and
# Kueue's CRDs): each test leaves it as it found it (its own namespace, a changed ResourceSlice put back).
origin = PEERED.fixture()


# The VirtualNode CRD is 9,000 lines: the C loader reads it in a tenth of the pure-Python time.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _crd_schema(kind: str) -> Obj:
    for path in sorted(CRDS.glob("*.yaml")):
        # file names are <group>_<plural>.yaml: only parse the one whose plural belongs to this kind
        if not path.stem.split("_", 1)[-1].startswith(kind.lower()):
            continue
        crd = yaml.load(path.read_text(), Loader=_LOADER)
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = crd["spec"]["versions"]
            return version["schema"]["openAPIV3Schema"]
    raise LookupError(f"no CRD for kind {kind} in {CRDS}")


def validate_liqo(obj: Obj) -> None:
    """Validate a Liqo object against the real CRD's openAPIV3Schema (raises on any violation)."""
    schema = _crd_schema(obj["kind"])
    assert obj["apiVersion"].endswith("/v1beta1")
    jsonschema.Draft202012Validator(schema).validate(obj)


def validate_builtin(obj: Obj) -> None:
    """Validate a built-in kind strictly; kubernetes-validate skips unknown kinds, so insist it validated."""
    validated = kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert validated == K8S_VERSION


@pytest.fixture(scope="session")
def liqo_schema() -> Callable[[Obj], None]:
    """Validator for Liqo objects against ../shared/liqo-crds."""
    assert CRDS.is_dir(), f"{CRDS} is missing: the repo must sit beside shared/"
    return validate_liqo


@pytest.fixture(scope="session")
def k8s_schema() -> Callable[[Obj], None]:
    """Strict validator for built-in kinds."""
    return validate_builtin


def _cond(ctype: str, status: str, message: str = "") -> Obj:
    cond = {"type": ctype, "status": status, "lastTransitionTime": "2026-11-22T01:00:00Z"}
    if message:
        cond["message"] = message
    return cond


def foreign_cluster(cluster_id: str, offloading: str = "Ready", networking: str = "Ready", auth: str = "Established",
                    role: str = "Provider", message: str = "") -> Obj:
    """A ForeignCluster as liqoctl peer leaves it, with the module conditions given."""
    return {
        "apiVersion": "core.liqo.io/v1beta1",
        "kind": "ForeignCluster",
        "metadata": {"name": cluster_id, "uid": f"uid-{cluster_id}", "resourceVersion": "11",
                     "labels": {"liqo.io/remote-cluster-id": cluster_id}},
        "spec": {"clusterID": cluster_id},
        "status": {
            "role": role,
            "apiServerUrl": f"https://{cluster_id}.example:6443",
            "tenantNamespace": {"local": f"liqo-tenant-{cluster_id}", "remote": "liqo-tenant-origin"},
            "conditions": [_cond("APIServerStatus", "Ready")],
            "modules": {
                "networking": {"enabled": True, "conditions": [_cond("NetworkConnectionStatus", networking, message)]},
                "authentication": {"enabled": True, "conditions": [_cond("AuthIdentityControlPlaneStatus", auth, message)]},
                "offloading": {"enabled": True, "conditions": [_cond("OffloadingVirtualNodeStatus", offloading, message)]},
            },
        },
    }


def virtual_node(name: str, cluster_id: str, gpus: int, model: str | None = None, **labels: str) -> Obj:
    """A VirtualNode CR as Liqo creates it for a granted GPU ResourceSlice, labelled by the admin."""
    spec_labels = {"gpu-offload.io/gpu-model": model} if model else {}
    spec_labels.update(labels)
    return {
        "apiVersion": "offloading.liqo.io/v1beta1",
        "kind": "VirtualNode",
        "metadata": {"name": name, "namespace": f"liqo-tenant-{cluster_id}", "resourceVersion": "21"},
        "spec": {
            "clusterID": cluster_id,
            "createNode": True,
            "labels": spec_labels,
            "resourceQuota": {"hard": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": str(gpus)}},
            "taints": [{"key": "virtual-node.liqo.io/not-allowed", "value": "true", "effect": "NoExecute"}],
        },
        "status": {"conditions": [{"type": "Node", "status": "Running"}, {"type": "VirtualKubelet", "status": "Running"}]},
    }


def node(name: str, cluster_id: str, gpus: int, model: str | None = None, ready: bool = True,
         unschedulable: bool = False, annotations: Obj | None = None, **labels: str) -> Obj:
    """The Node the virtual kubelet registers, as ``GET /api/v1/nodes`` returns it."""
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/role": "agent",
        "liqo.io/type": "virtual-node",
        "liqo.io/remote-cluster-id": cluster_id,
        "type": "virtual-kubelet",
    }
    if model:
        node_labels["gpu-offload.io/gpu-model"] = model
    node_labels.update(labels)
    qty = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    obj: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "31", "labels": node_labels,
                     "annotations": annotations or {}},
        "spec": {"taints": [{"key": "virtual-node.liqo.io/not-allowed", "value": "true", "effect": "NoExecute"}]},
        "status": {
            "capacity": dict(qty),
            "allocatable": dict(qty),
            "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown", "reason": "KubeletReady"}],
        },
    }
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return obj


def pod(name: str, node_name: str | None, gpus: int, phase: str = "Running", namespace: str = "alice") -> Obj:
    """A pod requesting GPUs, bound to ``node_name`` (None: still pending)."""
    spec: Obj = {"containers": [{"name": "main", "image": "python:3.11",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": spec, "status": {"phase": phase}}


@pytest.fixture
def api() -> Any:
    """Factories of realistic API objects: ``api.foreign_cluster(...)``, ``api.node(...)``, ..."""
    import types

    return types.SimpleNamespace(foreign_cluster=foreign_cluster, virtual_node=virtual_node, node=node, pod=pod)


KUEUE_CRDS = CRDS.parent / "kueue-crds"


@functools.cache
def _kueue_schema(kind: str) -> Obj:
    for path in sorted(KUEUE_CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=_LOADER)
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
            return version["schema"]["openAPIV3Schema"]
    raise LookupError(f"no CRD for kind {kind} in {KUEUE_CRDS}")


def _cel_rules(schema: Obj, value: Any, where: str) -> list[str]:
    """The CRD's CEL rules (x-kubernetes-validations) that ``value`` breaks; rules about updates are skipped."""
    import celpy

    broken = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"]:
            continue
        program = celpy.Environment().program(celpy.Environment().compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
            broken.append(f"{where}: {rule.get('message') or rule['rule']}")
    if isinstance(value, dict):
        for key, child in value.items():
            sub = (schema.get("properties") or {}).get(key)
            if sub is not None:
                broken += _cel_rules(sub, child, f"{where}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, child in enumerate(value):
            broken += _cel_rules(schema["items"], child, f"{where}[{i}]")
    return broken


def validate_kueue(obj: Obj) -> None:
    """Validate a Kueue object against the real CRD's v1beta2 openAPIV3Schema and its CEL rules."""
    assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    schema = _kueue_schema(obj["kind"])
    jsonschema.Draft202012Validator(schema).validate(obj)
    assert _cel_rules(schema, obj, obj["kind"]) == []


@pytest.fixture(scope="session")
def kueue_schema() -> Callable[[Obj], None]:
    """Validator for Kueue objects against ../shared/kueue-crds."""
    assert KUEUE_CRDS.is_dir(), f"{KUEUE_CRDS} is missing: the repo must sit beside shared/"
    return validate_kueue
