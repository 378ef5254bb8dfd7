"""``gpu-offload queues sync`` and ``queues`` through the official client, on both clusters: the sandbox
origin with Kueue's real CRDs installed through the API (as installing Kueue would register them), and the real
cluster of tests/realcluster/up.sh where real Kueue's webhooks validate every object the sync writes.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import kubernetes
import pytest
import yaml
from gpu_offload.liqo_peering.queue_client import KueueClient
from gpu_offload.sandbox.fixtures import install_crds, origin_key, pooled_as, wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.cli import main

from ..origins import PEERED
from ..realcluster.realorigin import RealOrigin, clusters, seeded_origin

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
DONORS = (liqo.Donor("donor-1", 4, "A100", "2.00"), liqo.Donor("donor-2", 8, "L4", "0.80"),
          liqo.Donor("donor-3", 2, "T4", "0.30"))
KUEUE = ("kueue.x-k8s.io", "v1beta2")


# the Liqo client's tests' origin (tests/origins.py), these three donors peered for the module
sandbox_origin = PEERED.with_donors(DONORS).fixture()


@pytest.fixture(scope="module", params=clusters())
@pooled_as(origin_key(PEERED.crds, PEERED.options))
def origin(request):
    if request.param == "real":
        with seeded_origin(DONORS, SHARED / "liqo-crds") as real:
            yield real
        return
    yield request.getfixturevalue("sandbox_origin")


@pytest.fixture(scope="module")
def api_client(origin):
    client = origin.sandbox.api_client()
    installed = []
    if not isinstance(origin, RealOrigin):  # the real cluster has real Kueue's own CRDs
        installed = install_crds(client, SHARED / "kueue-crds")
    yield client
    # the shared origin loses Kueue's CRDs again, and with them every object the sync wrote
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    for name in installed:
        extensions.delete_custom_resource_definition(name)
    client.close()


@pytest.fixture(autouse=True)
def kubeconfig(origin, api_client, monkeypatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)


@pytest.fixture()
def user_namespace(api_client):
    core = kubernetes.client.CoreV1Api(api_client)
    name = f"jhub-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    yield name
    core.delete_namespace(name)


def _get(api_client, plural: str, name: str, namespace: str | None = None) -> dict:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    if namespace:
        return custom.get_namespaced_custom_object(*KUEUE, namespace, plural, name)
    return custom.get_cluster_custom_object(*KUEUE, plural, name)


def _gpu_quota(api_client) -> dict[str, str]:
    queue = _get(api_client, "clusterqueues", "gpu-offload")
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}["nvidia.com/gpu"]
            for g in queue["spec"]["resourceGroups"] for f in g["flavors"]}


def _versions(api_client) -> dict[str, tuple]:
    """What a write by the sync would change: each object's generation (bumped by a spec write), labels and
    annotations. Not the resourceVersion: real Kueue writes the queues' status on its own."""
    client = KueueClient(api_client)
    return {f"{kind}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}": (
                o["metadata"].get("generation"), o["metadata"].get("labels"), o["metadata"].get("annotations"),
                {k: v for k, v in o.items() if k not in ("metadata", "status")})
            for kind in ("ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass", "LocalQueue")
            for o in client.list(kind)}


def test_sync_creates_the_pool_and_a_second_sync_writes_nothing(api_client, user_namespace, capsys) -> None:
    assert main(["queues", "sync", "--namespace", user_namespace]) == 0
    out = capsys.readouterr().out
    assert "create ClusterQueue gpu-offload: quota gpuo-donor-3-t4 2 GPU, gpuo-donor-2-l4 8 GPU" in out
    assert f"create LocalQueue {user_namespace}/gpu-offload" in out
    flavor = _get(api_client, "resourceflavors", "gpuo-donor-1-a100")
    assert flavor["spec"]["nodeLabels"] == {"liqo.io/remote-cluster-id": "donor-1", "gpu-offload.io/gpu-model": "A100"}
    # cheapest first, each flavor's quota what the donor granted
    assert list(_gpu_quota(api_client).items()) == [("gpuo-donor-3-t4", "2"), ("gpuo-donor-2-l4", "8"),
                                                     ("gpuo-donor-1-a100", "4")]
    # the rest of the spec is the CRD's defaults (stopPolicy: None), which the real API server fills in and
    # the sandbox does not (docs/realcluster.md, differences)
    assert _get(api_client, "localqueues", "gpu-offload", user_namespace)["spec"]["clusterQueue"] == "gpu-offload"
    assert _get(api_client, "workloadpriorityclasses", "batch")["value"] == 100

    before = _versions(api_client)
    assert main(["queues", "sync", "--namespace", user_namespace]) == 0
    assert capsys.readouterr().out.strip() == "nothing to change"
    assert _versions(api_client) == before  # no object was written


def test_dry_run_prints_the_diff_and_writes_nothing(origin, api_client, capsys) -> None:
    assert main(["queues", "sync"]) == 0
    core = kubernetes.client.CoreV1Api(api_client)
    core.patch_node("donor-2-gpu", {"spec": {"unschedulable": True}})
    try:
        capsys.readouterr()
        before = _versions(api_client)
        assert main(["queues", "sync", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "would patch ClusterQueue gpu-offload: quota gpuo-donor-3-t4 2 GPU, gpuo-donor-2-l4 0 GPU" in out
        assert _versions(api_client) == before
        assert _gpu_quota(api_client)["gpuo-donor-2-l4"] == "8"
    finally:
        core.patch_node("donor-2-gpu", {"spec": {"unschedulable": False}})


def test_a_cordoned_donors_quota_drops_to_zero_and_comes_back(api_client, capsys) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    assert main(["queues", "sync"]) == 0
    core.patch_node("donor-1-gpu", {"spec": {"unschedulable": True}})
    try:
        assert main(["queues", "sync"]) == 0
        assert _gpu_quota(api_client) == {"gpuo-donor-3-t4": "2", "gpuo-donor-2-l4": "8", "gpuo-donor-1-a100": "0"}
        flavor = _get(api_client, "clusterqueues", "gpu-offload")["spec"]["resourceGroups"][0]["flavors"][2]
        assert {r["name"]: r["nominalQuota"] for r in flavor["resources"]} == {
            "cpu": "0", "memory": "0", "nvidia.com/gpu": "0"}
    finally:
        core.patch_node("donor-1-gpu", {"spec": {"unschedulable": False}})
    assert main(["queues", "sync"]) == 0
    assert _gpu_quota(api_client)["gpuo-donor-1-a100"] == "4"


def test_queues_shows_the_pool(api_client, user_namespace, capsys) -> None:
    assert main(["queues", "sync", "--namespace", user_namespace]) == 0
    capsys.readouterr()
    assert main(["queues"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "ClusterQueue gpu-offload: 0 pending, 0 reserving, 0 admitted"
    assert lines[1].split() == ["FLAVOR", "CLUSTER", "MODEL", "GPUS", "GPUS", "USED", "CPU", "MEMORY"]
    assert lines[2].split()[:4] == ["gpuo-donor-3-t4", "donor-3", "T4", "2"]
    assert f"{user_namespace}/gpu-offload" in out
    assert "priority classes: interactive (1000), batch (100)" in out


def test_a_namespace_the_queue_does_not_admit_from_is_named_with_the_fix(api_client, capsys) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        assert main(["queues", "sync", "--namespace", name]) == 0
        assert f"kubectl label namespace {name} gpu-offload.io/user-namespace=true" in capsys.readouterr().out
    finally:
        core.delete_namespace(name)


def test_an_object_of_our_name_made_by_someone_else_is_left_alone(api_client, capsys, tmp_path) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": "urgent"},
        "value": 7})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"queueing": {"kueue": {"priorityClasses": [
        {"name": "urgent", "value": 5000}, {"name": "interactive", "value": 1000}]}}}))
    try:
        assert main(["queues", "--config", str(config), "sync"]) == 1
        out = capsys.readouterr().out
        assert main(["queues", "sync", "--config", str(config), "--dry-run"]) == 1  # either place works
        assert "conflict: WorkloadPriorityClass urgent" in capsys.readouterr().out
        assert "conflict: WorkloadPriorityClass urgent exists and is not managed by gpu-offload" in out
        assert _get(api_client, "workloadpriorityclasses", "urgent")["value"] == 7
        assert "delete WorkloadPriorityClass batch" in out  # ours, no longer configured
    finally:
        custom.delete_cluster_custom_object(*KUEUE, "workloadpriorityclasses", "urgent")
        main(["queues", "sync"])


def test_a_removed_donors_flavor_goes_after_the_queue_stops_naming_it(origin, api_client, capsys) -> None:
    assert main(["queues", "sync"]) == 0
    custom = kubernetes.client.CustomObjectsApi(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    # what unpeering leaves: no ForeignCluster, VirtualNode or Node of donor-3 (Liqo deletes a deleted
    # VirtualNode's Node)
    if isinstance(origin, RealOrigin):  # seeded objects, no Liqo: do what unpeering and its controllers would
        custom.delete_namespaced_custom_object("offloading.liqo.io", "v1beta1", "liqo-tenant-donor-3", "virtualnodes",
                                               "donor-3-gpu")
        custom.delete_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters", "donor-3")
        core.delete_node("donor-3-gpu")
    else:
        origin.unpeer(["donor-3"])  # the sandbox unpeers as liqoctl unpeer does
    try:
        _sync_after_donor_3_left(api_client, core, capsys)
    finally:
        if not isinstance(origin, RealOrigin):  # the origin is shared: donor-3 peered again, as the module found it
            origin.peer([DONORS[2]])


def _sync_after_donor_3_left(api_client, core, capsys) -> None:
    wait_until(lambda: "donor-3-gpu" not in [n.metadata.name for n in core.list_node().items], "donor-3's Node to go")
    capsys.readouterr()
    assert main(["queues", "sync"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["patch ClusterQueue gpu-offload: quota gpuo-donor-2-l4 8 GPU, gpuo-donor-1-a100 4 GPU",
                   "delete ResourceFlavor gpuo-donor-3-t4: no longer in the pool"]
    assert list(_gpu_quota(api_client)) == ["gpuo-donor-2-l4", "gpuo-donor-1-a100"]
    # real Kueue holds a flavor behind its finalizer until no ClusterQueue names it: gone soon after, not at once
    wait_until(lambda: "gpuo-donor-3-t4" not in {f["metadata"]["name"] for f in KueueClient(api_client).list(
        "ResourceFlavor")}, "the flavor gone", timeout=60, every=0.2)


def test_without_kueue_the_sync_says_to_install_it(origin, api_client, capsys) -> None:
    if isinstance(origin, RealOrigin):
        pytest.skip("removing real Kueue's API mid-run would break the other modules; the sandbox's 404 is the same")
    # a second, bare sandbox origin would cost seconds; a missing API is a 404 on the list, as here
    rule = origin.faults.api_error("^/apis/kueue.x-k8s.io/v1beta2/resourceflavors", status=404)
    try:
        assert main(["queues", "sync"]) == 1
    finally:
        origin.sandbox.api.faults.remove(rule)
    assert "install Kueue (docs/queueing.md)" in capsys.readouterr().err
