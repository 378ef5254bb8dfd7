"""Liqo's behaviour on the origin, observed through the official client as a user would."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes
import pytest
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.apiserver import crds
from gpu_offload.sandbox.fixtures import wait_until

from ...origins import TWO_A100

LIQO_CRDS = Path(__file__).resolve().parents[3] / ".." / "shared" / "liqo-crds"
origin = TWO_A100.fixture()  # every test leaves the origin as it found it
core, custom, namespace = fixtures.core, fixtures.custom, fixtures.namespace

LIQO = {"ForeignCluster": ("core.liqo.io", "foreignclusters"),
        "ResourceSlice": ("authentication.liqo.io", "resourceslices"),
        "VirtualNode": ("offloading.liqo.io", "virtualnodes")}


def _offload(custom, namespace: str, name: str = "offloading", **spec):
    body = {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": name}, "spec": {"podOffloadingStrategy": "Remote", **spec}}
    return custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace,
                                                  "namespaceoffloadings", body)


def _gpu_pod(name: str, gpus: int = 1, **spec) -> dict:
    return {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "python:3.11", "command": ["python3", "-c", "print('ran')"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}], **spec}}


def test_seeded_topology_is_served_and_valid_against_the_real_crds(custom, core):
    real = crds.load_crd_dir(LIQO_CRDS)
    for kind, (group, plural) in LIQO.items():
        items = custom.list_cluster_custom_object(group, "v1beta1", plural)["items"]
        assert len(items) == 2, kind
        for item in items:
            assert crds.schema_errors(item, real) == [], item["metadata"]["name"]
    nodes = {n.metadata.name: n for n in core.list_node(label_selector="liqo.io/type=virtual-node").items}
    assert sorted(nodes) == ["donor-1-gpu", "donor-2-gpu"]
    node = nodes["donor-1-gpu"]
    assert node.metadata.labels["liqo.io/remote-cluster-id"] == "donor-1"
    assert node.metadata.labels["gpu-offload.io/gpu-model"] == "A100"
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        ("virtual-node.liqo.io/not-allowed", "true", "NoExecute")]
    fc = custom.get_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters", "donor-2")
    assert fc["status"]["role"] == "Provider"
    assert all(m["enabled"] for m in fc["status"]["modules"].values())


def test_namespace_offloading_with_another_name_is_rejected(custom, namespace):
    with pytest.raises(kubernetes.client.ApiException) as err:
        _offload(custom, namespace, name="my-offloading")
    assert err.value.status == 422
    assert 'only acts on the one named "offloading"' in json.loads(err.value.body)["message"]
    assert custom.list_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace,
                                                "namespaceoffloadings")["items"] == []


def test_offloaded_namespace_is_labelled_and_ready(custom, core, namespace):
    _offload(custom, namespace)
    wait_until(lambda: (core.read_namespace(namespace).metadata.labels or {}).get("liqo.io/scheduling-enabled")
               == "true", "the scheduling-enabled label")
    status = wait_until(lambda: custom.get_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings", "offloading").get("status"),
        "NamespaceOffloading status")
    assert status["offloadingPhase"] == "Ready"
    assert sorted(status["remoteNamespacesConditions"]) == ["donor-1", "donor-2"]


def test_pods_in_an_offloaded_namespace_get_toleration_and_cluster_selector(custom, core, namespace):
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-2"]}]}]}
    _offload(custom, namespace, clusterSelector=selector)
    pod = core.create_namespaced_pod(namespace, _gpu_pod("gpu"))
    assert [(t.key, t.operator, t.effect) for t in pod.spec.tolerations if t.key.startswith("virtual-node")] == [
        ("virtual-node.liqo.io/not-allowed", "Exists", "NoExecute")]
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.operator, e.values) for e in terms[0].match_expressions] == [
        ("liqo.io/remote-cluster-id", "In", ["donor-2"]), ("liqo.io/type", "In", ["virtual-node"])]
    done = wait_until(lambda: (p := core.read_namespaced_pod("gpu", namespace)).status.phase == "Succeeded" and p,
                      "the GPU pod to succeed")
    assert done.spec.node_name == "donor-2-gpu"
    # client 36 turns a non-JSON body into str(bytes); read the raw response as users of it must
    assert core.read_namespaced_pod_log("gpu", namespace, _preload_content=False).data == b"ran\n"


def test_pod_aimed_at_a_virtual_node_from_a_plain_namespace_stays_pending_offloading_backoff(core, namespace):
    toleration = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}
    core.create_namespaced_pod(namespace, _gpu_pod("stuck", tolerations=[toleration]))
    pod = wait_until(lambda: (p := core.read_namespaced_pod("stuck", namespace)).status.reason and p,
                     "a reason on the pod")
    assert pod.spec.node_name.startswith("donor-")
    assert (pod.status.phase, pod.status.reason) == ("Pending", "OffloadingBackOff")
    assert "NamespaceOffloading" in pod.status.message
    assert pod.status.container_statuses is None  # never started


def test_changed_resource_slice_changes_the_virtual_node_capacity(custom, core):
    args = ("authentication.liqo.io", "v1beta1", "liqo-tenant-donor-1", "resourceslices", "donor-1-gpu")
    seeded = custom.get_namespaced_custom_object(*args)["spec"]["resources"]
    try:
        custom.patch_namespaced_custom_object(*args, {"spec": {"resources": {"nvidia.com/gpu": "2", "cpu": "8",
                                                                              "memory": "64Gi", "pods": "110"}}})
        wait_until(lambda: core.read_node("donor-1-gpu").status.allocatable.get("nvidia.com/gpu") == "2",
                   "the virtual node to offer 2 GPUs")
        vnode = custom.get_namespaced_custom_object("offloading.liqo.io", "v1beta1", "liqo-tenant-donor-1",
                                                    "virtualnodes", "donor-1-gpu")
        assert vnode["spec"]["resourceQuota"]["hard"]["nvidia.com/gpu"] == "2"
        assert core.read_node("donor-1-gpu").status.capacity["cpu"] == "8"
    finally:
        custom.patch_namespaced_custom_object(*args, {"spec": {"resources": seeded}})
    wait_until(lambda: core.read_node("donor-1-gpu").status.allocatable == seeded,
               "the virtual node to offer the seeded resources again")


RS = ("authentication.liqo.io", "v1beta1")
VN = ("offloading.liqo.io", "v1beta1")


def _slice(name: str, provider: str, gpus: int = 1, labels: dict | None = None,
           annotations: dict | None = None) -> dict:
    """A slice as ``liqoctl create resourceslice`` writes it (Liqo v1.2's forge.MutateResourceSlice), unless
    ``labels`` or ``annotations`` say otherwise."""
    return {"apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice",
            "metadata": {"name": name,
                         "labels": {"liqo.io/replication": "true", "liqo.io/remoteID": provider,
                                    "liqo.io/remote-cluster-id": provider} if labels is None else labels,
                         "annotations": {"liqo.io/create-virtual-node": "true"} if annotations is None else annotations},
            "spec": {"class": "default", "consumerClusterID": "origin", "providerClusterID": provider,
                     "resources": {"nvidia.com/gpu": str(gpus)}}}


def _node_named(core, name: str):
    return next((n for n in core.list_node().items if n.metadata.name == name), None)


def _gone(custom, core, tenant: str, name: str) -> bool:
    """The slice, its VirtualNode and its Node are all gone."""
    left = [plural for group, plural in ((RS, "resourceslices"), (VN, "virtualnodes"))
            if name in [o["metadata"]["name"] for o in custom.list_namespaced_custom_object(*group, tenant, plural)["items"]]]
    return not left and _node_named(core, name) is None


def _status(custom, tenant: str, name: str) -> dict:
    return custom.get_namespaced_custom_object(*RS, tenant, "resourceslices", name).get("status") or {}


def test_new_gpu_slice_of_a_donor_becomes_a_new_virtual_node_and_one_for_an_unknown_peer_is_never_granted(
        custom, core):
    # Real Liqo 1.2 (test_real_liqo.py shows it): a slice labelled for a cluster nobody peered is sent nowhere,
    # so no provider ever answers: no status at all, and no node
    tenant = "liqo-tenant-donor-2"
    custom.create_namespaced_custom_object(*RS, tenant, "resourceslices", _slice("donor-2-extra", "donor-2"))
    try:
        custom.create_namespaced_custom_object(*RS, tenant, "resourceslices", _slice("stranger", "nobody"))
        node = wait_until(lambda: _node_named(core, "donor-2-extra"), "the new virtual node")
        assert node.status.allocatable["nvidia.com/gpu"] == "1"
        assert node.metadata.labels["liqo.io/remote-cluster-id"] == "donor-2"
        assert not _status(custom, tenant, "stranger") and _node_named(core, "stranger") is None
    finally:  # the origin is shared: its slices and nodes go back to the seeded two
        for name in ("donor-2-extra", "stranger"):
            with contextlib.suppress(kubernetes.client.ApiException):
                custom.delete_namespaced_custom_object(*RS, tenant, "resourceslices", name)
            wait_until(lambda name=name: _gone(custom, core, tenant, name), f"slice {name} and its nodes to go")


@pytest.mark.parametrize(("labels", "annotations", "granted"), [
    ({}, None, False),  # not labelled for replication: Liqo neither signs nor sends it
    ({"liqo.io/replication": "true", "liqo.io/remote-cluster-id": "donor-2"}, None, False),  # no destination
    (None, {}, True),  # granted, but nobody asked Liqo for a virtual node
    (None, {"liqo.io/create-virtual-node": "False"}, True),
    ({"liqo.io/replication": "true", "liqo.io/remoteID": "donor-2"}, None, True),  # no cluster id for the node
], ids=["no-replication-labels", "no-destination", "no-annotation", "annotation-false", "no-cluster-id-label"])
def test_a_slice_gets_a_virtual_node_only_when_it_asks_for_one_as_real_liqo_requires(
        custom, core, labels, annotations, granted):
    """Liqo v1.2's requirements (its LocalResourcesLabelSelector and virtualnodecreator-controller), which the
    hub's slice builder must meet: checked against a slice that meets them all, created after the one that
    does not, so that by the time its node exists the other one's fate is settled."""
    tenant = "liqo-tenant-donor-2"
    custom.create_namespaced_custom_object(*RS, tenant, "resourceslices",
                                           _slice("lacking", "donor-2", labels=labels, annotations=annotations))
    custom.create_namespaced_custom_object(*RS, tenant, "resourceslices", _slice("complete", "donor-2"))
    try:
        wait_until(lambda: _node_named(core, "complete"), "the complete slice's virtual node")
        status = wait_until(lambda: _status(custom, tenant, "lacking") or not granted, "the lacking slice's answer")
        assert _node_named(core, "lacking") is None
        if granted:
            assert {c["type"]: c["status"] for c in status["conditions"]} == {"Authentication": "Accepted",
                                                                              "Resources": "Accepted"}
        else:
            assert not _status(custom, tenant, "lacking"), "a slice Liqo never sends was granted"
    finally:
        for name in ("lacking", "complete"):
            with contextlib.suppress(kubernetes.client.ApiException):
                custom.delete_namespaced_custom_object(*RS, tenant, "resourceslices", name)
            wait_until(lambda name=name: _gone(custom, core, tenant, name), f"slice {name} and its nodes to go")


def test_a_deleted_gpu_slice_drains_and_removes_its_virtual_node(custom, core, namespace):
    # Liqo: the slice owns the VirtualNode it made; the VirtualNode's finalizer drains and deletes the Node
    tenant = "liqo-tenant-donor-1"
    custom.create_namespaced_custom_object(*RS, tenant, "resourceslices", _slice("donor-1-spare", "donor-1"))
    wait_until(lambda: _node_named(core, "donor-1-spare"), "the slice's virtual node")
    vnode = custom.get_namespaced_custom_object(*VN, tenant, "virtualnodes", "donor-1-spare")
    assert [(r["kind"], r["name"], r["controller"]) for r in vnode["metadata"]["ownerReferences"]] == [
        ("ResourceSlice", "donor-1-spare", True)]
    assert "virtualnode-controller.liqo.io/finalizer" in wait_until(
        lambda: custom.get_namespaced_custom_object(*VN, tenant, "virtualnodes", "donor-1-spare")["metadata"].get(
            "finalizers"), "Liqo's finalizer on the VirtualNode")
    _offload(custom, namespace)
    held = _gpu_pod("held", nodeSelector={"kubernetes.io/hostname": "donor-1-spare"})
    held["spec"]["containers"][0]["command"] = ["python3", "-c", "import time; time.sleep(600)"]
    core.create_namespaced_pod(namespace, held)
    wait_until(lambda: core.read_namespaced_pod("held", namespace).status.phase == "Running", "the pod to run")

    custom.delete_namespaced_custom_object(*RS, tenant, "resourceslices", "donor-1-spare")
    wait_until(lambda: _gone(custom, core, tenant, "donor-1-spare"), "the slice, its VirtualNode and Node to go")
    assert "held" not in [p.metadata.name for p in core.list_namespaced_pod(namespace).items]  # evicted
    assert core.read_node("donor-1-gpu").status.allocatable["nvidia.com/gpu"] == "4"  # the seeded slice's node stays


def test_fault_control_endpoint_rejects_bad_input_with_the_fix(origin):
    request = urllib.request.Request(origin.sandbox.url + "/sandbox/faults", data=b'{"fault": "meteor"}',
                                     method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 400
    assert "use one of api-error, api-latency" in json.loads(err.value.read())["error"]
