"""Inventory, cache and placement through the official client against the sandbox origin (real HTTP)."""

from __future__ import annotations

import uuid

import kubernetes
import pytest
from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.errors import APIForbidden, APIServerError
from gpu_offload.liqo_peering.placement import PlacementRequest, place
from gpu_offload.liqo_peering.specs import gpu_resource_slice, namespace_offloading
from gpu_offload.sandbox.fixtures import wait_until


@pytest.fixture(scope="module")
def liqo_client(api_client) -> LiqoClient:
    return LiqoClient(api_client)


def test_inventory_of_the_seeded_donors(liqo_client) -> None:
    inventory = liqo_client.read_inventory()
    assert [(c.cluster_id, c.role, c.health) for c in inventory.clusters] == [
        ("donor-1", "Provider", "healthy"), ("donor-2", "Provider", "healthy")]
    got = {vn.name: (vn.cluster_id, vn.model, vn.allocatable, vn.in_use, vn.free, vn.price, vn.ready, vn.cordoned)
           for vn in inventory.virtual_nodes}
    assert got == {"donor-1-gpu": ("donor-1", "A100", 4, 0, 4, 2.0, True, False),
                   "donor-2-gpu": ("donor-2", "L4", 8, 0, 8, 0.8, True, False)}
    assert place(inventory, PlacementRequest(2)).cluster_id == "donor-2"  # most free


def test_gpus_in_use_follow_a_placed_pod(origin, api_client, liqo_client) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    namespace = f"team-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        body = namespace_offloading(namespace, ["donor-1"])
        custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings", body)
        placement = place(liqo_client.read_inventory(), PlacementRequest(3, "A100"))
        fragment = placement.scheduling_fragment()
        pod = {"metadata": {"name": "holder"}, "spec": {
            "restartPolicy": "Never", "tolerations": fragment["tolerations"], "affinity": fragment["affinity"],
            "containers": [{"name": "main", "image": "python:3.11", "resources": fragment["resources"],
                            "command": ["python3", "-c", "import time; time.sleep(120)"]}]}}
        core.create_namespaced_pod(namespace, pod)
        node = wait_until(lambda: core.read_namespaced_pod("holder", namespace).spec.node_name, "pod bound")
        assert node == "donor-1-gpu"
        (vn,) = [v for v in liqo_client.read_inventory().virtual_nodes if v.name == "donor-1-gpu"]
        assert (vn.in_use, vn.free) == (3, 1)
    finally:
        core.delete_namespace(namespace)


def test_api_errors_are_mapped(origin, liqo_client) -> None:
    # 500, not 503: the client's urllib3 honours the sandbox's Retry-After on 503 and would retry past a one-shot fault.
    rule = origin.faults.api_error("^/api/v1/nodes", status=500)
    try:
        with pytest.raises(APIServerError, match=r"listing Nodes \(cluster-wide\) failed \(HTTP 500"):
            liqo_client.list("Node")
    finally:
        origin.sandbox.api.faults.remove(rule)
    # A user without cluster-wide pod rights (inside a hub deployment) is told what to do, not shown a trace.
    rule = origin.faults.api_error("^/api/v1/pods", status=403)
    try:
        with pytest.raises(APIForbidden, match=r"listing Pods \(cluster-wide\) failed \(HTTP 403.*RBAC"):
            liqo_client.read_inventory()
    finally:
        origin.sandbox.api.faults.remove(rule)


def test_cache_follows_a_lost_node_and_relists_after_compaction(origin, liqo_client) -> None:
    with InventoryCache(liqo_client, watch_seconds=1) as cache:
        assert cache.wait_synced(60)
        assert {c.cluster_id for c in cache.inventory().clusters} == {"donor-1", "donor-2"}
        origin.call(origin.faults.node_not_ready("donor-2-gpu", grace=0))
        try:
            wait_until(lambda: not _node(cache, "donor-2-gpu").ready, "cache sees donor-2-gpu NotReady")
            assert place(cache.inventory(), PlacementRequest(1)).cluster_id == "donor-1"
        finally:
            origin.faults.node_ready("donor-2-gpu")
        wait_until(lambda: _node(cache, "donor-2-gpu").ready, "cache sees donor-2-gpu Ready again")
        before = _relists(cache)
        # Kinds unchanged since the node events (VirtualNodes at least) resume from before the compaction.
        origin.sandbox.api.store.compact()
        wait_until(lambda: _relists(cache) > before, "a watch relists after 410 Gone")
        assert all(s["last_error"] == "" for s in cache.stats().values())
        assert {c.cluster_id for c in cache.inventory().clusters} == {"donor-1", "donor-2"}


def _relists(cache: InventoryCache) -> int:
    return sum(s["relists"] for s in cache.stats().values())

def _node(cache: InventoryCache, name: str):
    return next(v for v in cache.inventory().virtual_nodes if v.name == name)


def test_a_built_gpu_slice_is_granted_and_shows_up_as_a_virtual_node(api_client, liqo_client) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = gpu_resource_slice("donor-1-gpu-extra", "liqo-tenant-donor-1", "origin", "donor-1", 2, cpu="4", memory="16Gi")
    custom.create_namespaced_custom_object("authentication.liqo.io", "v1beta1", "liqo-tenant-donor-1", "resourceslices", body)
    try:
        extra = wait_until(lambda: next((v for v in liqo_client.read_inventory().virtual_nodes
                                         if v.name == "donor-1-gpu-extra" and v.ready), None), "virtual node of the slice")
        assert (extra.cluster_id, extra.allocatable, extra.free) == ("donor-1", 2, 2)
    finally:
        custom.delete_namespaced_custom_object("authentication.liqo.io", "v1beta1", "liqo-tenant-donor-1",
                                               "resourceslices", "donor-1-gpu-extra")


def test_cli_clusters_table_and_json(origin, monkeypatch, capsys) -> None:
    import json

    from gpu_offload.cli import main

    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["clusters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CLUSTER")
    assert any(line.split()[:5] == ["donor-2", "healthy", "untrusted", "donor-2-gpu", "L4"] for line in lines)
    assert main(["clusters", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {c["cluster_id"] for c in data["clusters"]} >= {"donor-1", "donor-2"}


def test_cli_clusters_without_a_cluster_explains(monkeypatch, capsys, tmp_path) -> None:
    from gpu_offload.cli import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["clusters"]) == 1
    assert "point KUBECONFIG at a kubeconfig for the origin cluster" in capsys.readouterr().err
