"""Donors peered into a running origin and unpeered from it, as Liqo does at run time (sandbox/liqo/peering.py),
observed through the official client; and the shared origin's check naming a peering left behind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox import fixtures, leftovers
from gpu_offload.sandbox.apiserver import crds
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from ...origins import TWO_A100

LIQO_CRDS = Path(__file__).resolve().parents[3] / ".." / "shared" / "liqo-crds"
origin = TWO_A100.fixture()  # its two donors peered for this module; every test leaves them as they were
core, custom, namespace = fixtures.core, fixtures.custom, fixtures.namespace
LATE = liqo.Donor("late", 2, "L4", "0.50")
LIQO = {"ForeignCluster": ("core.liqo.io", "foreignclusters"),
        "ResourceSlice": ("authentication.liqo.io", "resourceslices"),
        "VirtualNode": ("offloading.liqo.io", "virtualnodes")}


@pytest.fixture()
def late(origin: Any) -> Iterator[liqo.Donor]:
    """LATE peered for one test, unpeered after it if the test did not."""
    origin.peer([LATE])
    try:
        yield LATE
    finally:
        if LATE.cluster_id in origin.peered():
            origin.unpeer([LATE.cluster_id])


def _offload(custom: Any, namespace: str) -> None:
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings", {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading", "metadata": {"name": "offloading"},
        "spec": {"podOffloadingStrategy": "Remote"}})


def _pod_on(cluster: str, name: str, code: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {liqo.REMOTE_CLUSTER_ID_LABEL: cluster},
        "containers": [{"name": "main", "image": "python:3.11", "command": ["python3", "-c", code],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def _gone(read: Any) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_a_donor_peered_into_a_running_origin_is_served_as_liqo_makes_it_and_runs_pods(
        origin: Any, late: liqo.Donor, custom: Any, core: Any, namespace: str) -> None:
    assert origin.peered() == ["donor-1", "donor-2", "late"]
    real = crds.load_crd_dir(LIQO_CRDS)
    fc = custom.get_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters", "late")
    assert fc["status"]["role"] == "Provider" and all(m["enabled"] for m in fc["status"]["modules"].values())
    for kind, (group, plural) in LIQO.items():
        items = [i for i in custom.list_cluster_custom_object(group, "v1beta1", plural)["items"]
                 if i["metadata"]["name"] in ("late", "late-gpu")]
        assert len(items) == 1, kind
        assert crds.schema_errors(items[0], real) == [], kind
    vnode = custom.get_namespaced_custom_object("offloading.liqo.io", "v1beta1", "liqo-tenant-late", "virtualnodes",
                                                "late-gpu")
    assert [ref["kind"] for ref in vnode["metadata"]["ownerReferences"]] == ["ResourceSlice"]
    node = wait_until(lambda: core.read_node("late-gpu"), "the late donor's virtual node")
    assert node.metadata.labels["gpu-offload.io/gpu-model"] == "L4"
    assert node.metadata.labels["gpu-offload.io/price-per-gpu-hour"] == "0.50"
    assert node.status.allocatable["nvidia.com/gpu"] == "2"
    _offload(custom, namespace)
    core.create_namespaced_pod(namespace, _pod_on("late", "on-late", "print('ran on late')"))
    done = wait_until(lambda: (p := core.read_namespaced_pod("on-late", namespace)).status.phase == "Succeeded" and p,
                      "the pod on the late donor to succeed", timeout=120)
    assert done.spec.node_name == "late-gpu"
    log = core.read_namespaced_pod_log("on-late", namespace, _preload_content=False).data.decode()
    assert log == "ran on late\n"


def test_unpeering_a_donor_evicts_its_pods_and_takes_away_what_liqo_made_for_it(
        origin: Any, late: liqo.Donor, custom: Any, core: Any, namespace: str) -> None:
    _offload(custom, namespace)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "token"}, "stringData": {"k": "v"}})
    core.create_namespaced_pod(namespace, _pod_on("late", "long", "import time; time.sleep(600)"))
    wait_until(lambda: core.read_namespaced_pod("long", namespace).status.phase == "Running", "the pod running",
               timeout=120)
    wait_until(lambda: any(s["metadata"]["name"] == "token" for s in origin.donor_copies.holds("late")),
               "the Secret reflected to the late donor")

    origin.unpeer(["late"])

    assert _gone(lambda: core.read_namespaced_pod("long", namespace))  # evicted, as Liqo drains the virtual node
    assert _gone(lambda: core.read_node("late-gpu"))
    assert _gone(lambda: custom.get_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters", "late"))
    assert _gone(lambda: core.read_namespace("liqo-tenant-late"))
    for kind, (group, plural) in LIQO.items():
        names = [i["metadata"]["name"] for i in custom.list_cluster_custom_object(group, "v1beta1", plural)["items"]]
        assert sorted(names) == (["donor-1", "donor-2"] if kind == "ForeignCluster" else
                                 ["donor-1-gpu", "donor-2-gpu"]), kind
    assert origin.donor_copies.holds("late") == [] and origin.donor_copies.was_sent("late") == []
    assert origin.peered() == ["donor-1", "donor-2"]  # the other donors stay peered
    assert core.read_node("donor-1-gpu").status.allocatable["nvidia.com/gpu"] == "4"


def test_peering_a_peered_donor_or_unpeering_an_unknown_one_is_refused_and_changes_nothing(origin: Any,
                                                                                           custom: Any) -> None:
    def slices() -> list[str]:
        return sorted(i["metadata"]["name"] for i in custom.list_cluster_custom_object(
            "authentication.liqo.io", "v1beta1", "resourceslices")["items"])

    before = slices()
    with pytest.raises(ValueError, match="donor-1 already peered"):
        origin.peer([LATE, liqo.Donor("donor-1", 1, "A100", "2.00")])
    with pytest.raises(ValueError, match="nobody not peered"):
        origin.unpeer(["nobody"])
    assert slices() == before and origin.peered() == ["donor-1", "donor-2"]


def test_the_shared_origin_check_names_a_peering_left_behind_and_is_clean_once_it_is_unpeered(origin: Any) -> None:
    api = origin.sandbox.api
    system = leftovers.system_namespaces(api)
    before = leftovers.cluster_state(api, system)
    origin.peer([LATE])
    try:
        lines = wait_until(lambda: leftovers.differences(before, leftovers.cluster_state(api, system)),
                           "the peering to show")
        assert "namespaces.core liqo-tenant-late was left behind" in lines, lines
        assert "resourceslices.authentication.liqo.io liqo-tenant-late/late-gpu was left behind" in lines, lines
        assert "foreignclusters.core.liqo.io late was left behind" in lines, lines
    finally:
        origin.unpeer(["late"])
    assert leftovers.differences(before, leftovers.cluster_state(api, system)) == []


def test_a_module_asking_for_other_donors_while_a_fixture_holds_the_origin_is_refused(
        origin: Any, origin_pool: fixtures.OriginPool) -> None:
    shared = origin_pool.shared(TWO_A100.crds, **TWO_A100.options)
    assert shared.running is origin
    refused = "asks for donors late on an origin that holds donor-1, donor-2"
    with pytest.raises(RuntimeError, match=refused), shared.lent((LATE,), "another module"):
        pass
    with shared.lent(TWO_A100.donors, "a module with the same donors") as running:  # shared, not peered again
        assert running.peered() == ["donor-1", "donor-2"]
    assert origin.peered() == ["donor-1", "donor-2"]  # still held by this module


def test_after_a_module_that_left_a_running_pod_fails_the_next_one_finds_the_donor_free(
        origin: Any, origin_pool: fixtures.OriginPool, core: Any, custom: Any) -> None:
    shared = origin_pool.shared(TWO_A100.crds, **TWO_A100.options)
    left = f"t-left-{uuid.uuid4().hex[:6]}"
    with (pytest.raises(pytest.fail.Exception, match=f"pods.core {left}/holder is still running"),
          shared.lent(TWO_A100.donors, "a module that fails to clean up", grace=1.0) as running):
        core.create_namespace({"metadata": {"name": left}})
        _offload(custom, left)
        core.create_namespaced_pod(left, _pod_on("donor-1", "holder", "import time; time.sleep(600)"))
        wait_until(lambda: core.read_namespaced_pod("holder", left).status.phase == "Running",
                   "the pod holding a GPU of donor-1", timeout=120)
    # the failing module was blamed; what it left is gone, so the next module is not judged by it or short of GPUs
    assert _gone(lambda: core.read_namespace(left))
    assert not [p for p in core.list_pod_for_all_namespaces().items if p.metadata.namespace == left]
    assert leftovers.differences(shared.expected, shared.state()) == []
    assert running.peered() == ["donor-1", "donor-2"]
