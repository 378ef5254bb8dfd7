"""What real Kueue does that the issue found by reading its code, proven on the real cluster: its pod webhook
gates and finalizes a queued pod, and since 0.19 a flavor matches a pod's affinity on its own keys only, so the
project narrows a model request by cluster id (``queued_scheduling``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering import kueue as K
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from .realorigin import RealOrigin, seeded_origin

pytestmark = pytest.mark.real_cluster
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
G, V = "kueue.x-k8s.io", "v1beta2"
GPU = "nvidia.com/gpu"
TOLERATION = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def origin() -> Iterator[RealOrigin]:
    # donor-1 is the real node (A100 by its label); donor-2 a node with nothing behind it whose model only
    # the admin knows, so its flavor selects on the cluster id alone
    with seeded_origin((liqo.Donor("donor-1", 4, "A100", "2.00"), liqo.Donor("donor-2", 4, "H100", "0.50")),
                       SHARED / "liqo-crds") as real:
        yield real


@pytest.fixture(scope="module")
def clients(origin: RealOrigin) -> Iterator[tuple[Any, Any]]:
    with origin.sandbox.api_client() as client:
        yield kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)


@pytest.fixture()
def pool(clients: tuple[Any, Any]) -> Iterator[str]:
    """A user namespace with LocalQueue q on ClusterQueue pool: flavor cluster-only (donor-2, cheapest, tried
    first) and flavor donor-1-a100 (cluster and model), as the project's sync makes them for an admin-set model
    and a labelled one."""
    core, custom = clients
    namespace = f"jhub-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    flavors = {"donor-2-any": {"liqo.io/remote-cluster-id": "donor-2"},
               "donor-1-a100": {"liqo.io/remote-cluster-id": "donor-1", "gpu-offload.io/gpu-model": "A100"}}
    for name, labels in flavors.items():
        custom.create_cluster_custom_object(G, V, "resourceflavors", {
            "apiVersion": f"{G}/{V}", "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": labels, "tolerations": [TOLERATION]}})
    custom.create_cluster_custom_object(G, V, "clusterqueues", {
        "apiVersion": f"{G}/{V}", "kind": "ClusterQueue", "metadata": {"name": "pool"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": name, "resources": [{"name": GPU, "nominalQuota": 4}]} for name in flavors]}]}})
    custom.create_namespaced_custom_object(G, V, namespace, "localqueues", {
        "apiVersion": f"{G}/{V}", "kind": "LocalQueue", "metadata": {"name": "q"},
        "spec": {"clusterQueue": "pool"}})
    yield namespace
    core.delete_namespace(namespace)
    wait_until(lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
               "the namespace gone", timeout=120, every=0.5)
    custom.delete_cluster_custom_object(G, V, "clusterqueues", "pool")
    for name in flavors:
        custom.delete_cluster_custom_object(G, V, "resourceflavors", name)
    # Kueue lets a flavor go (its finalizer) only once no ClusterQueue names it: the next test makes the same names
    wait_until(lambda: not {f["metadata"]["name"] for f in custom.list_cluster_custom_object(
        G, V, "resourceflavors")["items"]} & set(flavors), "the flavors gone", timeout=120, every=0.5)


def _pod(name: str, scheduling: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "q"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "affinity": scheduling.get("affinity"), "containers": [{
                         "name": "main", "image": "python:3.11-slim",
                         "command": ["python3", "-c", "import os, time; print(os.environ.get('NVIDIA_VISIBLE_DEVICES'),"
                                     " flush=True); time.sleep(600)"],
                         "resources": scheduling["resources"]}]}}


def _admitted_node_selector(core: Any, namespace: str, name: str) -> dict[str, str]:
    def ungated() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if not pod.spec.scheduling_gates else None
    return dict(wait_until(ungated, f"Kueue to admit {name}", timeout=120, every=0.5).spec.node_selector or {})


def test_kueues_webhook_gates_and_finalizes_a_queued_pod(clients: tuple[Any, Any], pool: str) -> None:
    core, _ = clients
    created = core.create_namespaced_pod(pool, _pod("gated", K.queued_scheduling(5)))  # more than any quota
    # Kueue 0.19 adds its topology gate too, even without Topology Aware Scheduling configured
    assert [g.name for g in created.spec.scheduling_gates] == ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"]
    assert "kueue.x-k8s.io/managed" in created.metadata.finalizers
    core.delete_namespaced_pod("gated", pool, grace_period_seconds=0)
    # Kueue removes its finalizer once it has accounted for the pod: the pod does go away
    wait_until(lambda: not core.list_namespaced_pod(pool).items, "the gated pod gone", timeout=60, every=0.5)


def test_a_model_key_alone_is_matched_by_a_cluster_only_flavor_and_the_cluster_terms_are_not(
        clients: tuple[Any, Any], pool: str) -> None:
    core, _ = clients
    # the pre-fix affinity: the model label alone. Kueue 0.19 ignores keys a flavor lacks, so the cheaper
    # cluster-only flavor (donor-2) matches an A100 request
    model_only = {"resources": {"limits": {GPU: "1"}}, "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu-offload.io/gpu-model", "operator": "In", "values": ["A100"]}]}]}}}}
    core.create_namespaced_pod(pool, _pod("model-only", model_only))
    assert _admitted_node_selector(core, pool, "model-only") == {"liqo.io/remote-cluster-id": "donor-2"}

    # the project's affinity: one term per cluster having the model, by cluster id
    fixed = K.queued_scheduling(1, (), {"donor-1": ("A100",)})
    core.create_namespaced_pod(pool, _pod("by-cluster", fixed))
    assert _admitted_node_selector(core, pool, "by-cluster") == {
        "liqo.io/remote-cluster-id": "donor-1", "gpu-offload.io/gpu-model": "A100"}
    # and it runs on the real node with one of the device plugin's GPUs
    running = wait_until(lambda: (p := core.read_namespaced_pod("by-cluster", pool)).status.phase == "Running" and p,
                         "the pod running", timeout=120, every=0.5)
    assert running.spec.node_name == "donor-1-gpu"
    wait_until(lambda: "fake-gpu-" in core.read_namespaced_pod_log("by-cluster", pool), "the pod's GPU id logged",
               timeout=60, every=0.5)
    for name in ("model-only", "by-cluster"):
        core.delete_namespaced_pod(name, pool, grace_period_seconds=0)
