"""The hub's queue controller against the sandbox origin and against the real cluster with real Kueue (Liqo's
objects seeded), through the official client and real watches: it builds the pool when it starts, follows a
cordon, ignores pod churn, and audits what it wrote."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.service.queues import WHO, QueueController
from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.kueue import QueueSettings
from gpu_offload.liqo_peering.queue_client import KueueClient
from gpu_offload.liqo_peering.trust import TrustPolicy
from gpu_offload.sandbox.fixtures import install_crds, origin_key, pooled_as, wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from ...origins import TWO_A100
from ...realcluster.realorigin import clusters, seeded_origin

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
DONORS = (liqo.Donor("donor-1", 4, "A100", "2.00"), liqo.Donor("donor-2", 8, "L4", "0.80"))
# the hub tests' origin (tests/origins.py), these donors peered for the module; Kueue's CRDs are installed through
# the API for the module and deleted after it, which takes the ClusterQueue and flavors the controller made
sandbox_origin = TWO_A100.with_donors(DONORS).fixture()


@pytest.fixture(scope="module", params=clusters())
@pooled_as(origin_key(TWO_A100.crds, TWO_A100.options))
def origin(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "real":  # real Kubernetes and Kueue (tests/realcluster), a real node per donor
        with seeded_origin(DONORS, SHARED / "liqo-crds") as real:
            yield real
        return
    yield request.getfixturevalue("sandbox_origin")


@pytest.fixture(scope="module")
def k8s(origin: Any) -> Iterator[Any]:
    client = origin.sandbox.api_client()
    installed = install_crds(client, SHARED / "kueue-crds")  # none on the real cluster: real Kueue serves them
    yield client
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    for name in installed:
        extensions.delete_custom_resource_definition(name)
    client.close()


@pytest.fixture()
def controller(k8s: Any, tmp_path: Path) -> Iterator[QueueController]:
    cache = InventoryCache(LiqoClient(k8s, trust=TrustPolicy())).start()
    store = Store(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    running = QueueController(cache, KueueClient(k8s), QueueSettings(), TrustPolicy(), store).start()
    yield running
    running.close()
    cache.close()
    store.close()


def _gpu_quota(k8s: Any) -> dict[str, str] | None:
    try:
        queue = kubernetes.client.CustomObjectsApi(k8s).get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", "gpu-offload")
    except kubernetes.client.ApiException:
        return None
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}["nvidia.com/gpu"]
            for g in queue["spec"]["resourceGroups"] for f in g["flavors"]}


def test_the_controller_follows_the_inventory_and_audits_its_writes(controller: QueueController, k8s: Any) -> None:
    wait_until(lambda: _gpu_quota(k8s) == {"gpuo-donor-2-l4": "8", "gpuo-donor-1-a100": "4"}, "the pool built")
    # the controller audits a pass after its writes: the pool can be seen built a moment before the entry
    (first,) = wait_until(lambda: controller.store.audit_log(), "the first pass audited")
    assert (first.who, first.action, first.ok) == (WHO, "queues-sync", True)
    assert "create ResourceFlavor gpuo-donor-1-a100" in first.result

    # pod churn changes the inventory but not the pool: no reconcile, no API request
    core = kubernetes.client.CoreV1Api(k8s)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        passes = controller.passes
        core.create_namespaced_pod(name, {"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "image": "python:3.11-slim", "command": ["sleep", "60"]}]}})
        seen = wait_until(lambda: any(p["metadata"]["name"] == "p" for p in controller.cache.objects("Pod"))
                          and controller.cache.wait_changed(-1, 0), "the pod in the cache")
        wait_until(lambda: controller.generation >= seen, "the controller looked at the change")
        assert controller.passes == passes
    finally:
        core.delete_namespace(name)

    core.patch_node("donor-1-gpu", {"spec": {"unschedulable": True}})
    try:
        wait_until(lambda: _gpu_quota(k8s) == {"gpuo-donor-2-l4": "8", "gpuo-donor-1-a100": "0"}, "quota dropped")
        dropped = "patch ClusterQueue gpu-offload: quota gpuo-donor-2-l4 8 GPU, gpuo-donor-1-a100 0 GPU"
        latest = wait_until(lambda: next((e for e in controller.store.audit_log() if dropped in e.result), None),
                            "the quota drop audited")
        assert latest.ok, latest
    finally:
        core.patch_node("donor-1-gpu", {"spec": {"unschedulable": False}})
    wait_until(lambda: _gpu_quota(k8s) == {"gpuo-donor-2-l4": "8", "gpuo-donor-1-a100": "4"}, "quota back")


def test_a_failing_reconcile_is_audited_and_retried(controller: QueueController, origin: Any, k8s: Any) -> None:
    if not hasattr(origin, "faults"):
        pytest.skip("injects an API fault, which only the sandbox's API server takes")
    rule = origin.faults.api_error("^/apis/kueue.x-k8s.io/v1beta2/clusterqueues$", status=500, methods=("GET",))
    core = kubernetes.client.CoreV1Api(k8s)
    try:
        # the controller may have finished its first pass before the fault was in place: a change of the pool
        # (a cordon) makes it reconcile again, into the fault
        core.patch_node("donor-1-gpu", {"spec": {"unschedulable": True}})
        wait_until(lambda: any(not e.ok for e in controller.store.audit_log()), "the failure audited")
    finally:
        origin.sandbox.api.faults.remove(rule)
        core.patch_node("donor-1-gpu", {"spec": {"unschedulable": False}})
    failed = next(e for e in controller.store.audit_log() if not e.ok)
    assert "listing ClusterQueues failed (HTTP 500" in failed.result
