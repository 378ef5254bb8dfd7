"""The diff from what exists to what the pool should have: pure, so every case is a literal."""

from __future__ import annotations

import copy

from gpu_offload.liqo_peering import kueue as K
from gpu_offload.liqo_peering.inventory import build_inventory
from gpu_offload.liqo_peering.queue_sync import covers, plan
from gpu_offload.liqo_peering.trust import TrustPolicy

from .conftest import foreign_cluster, node


def _desired(*nodes, namespaces=()):
    clusters = sorted({n["metadata"]["labels"]["liqo.io/remote-cluster-id"] for n in nodes})
    inventory = build_inventory([foreign_cluster(c) for c in clusters], [], list(nodes), [])
    return K.desired(inventory, TrustPolicy(), K.QueueSettings(), namespaces)


def _as_served(obj):
    """``obj`` as a real API server returns it: server metadata, and the CRD's defaults filled in."""
    served = copy.deepcopy(obj)
    served["metadata"].update(uid="u", resourceVersion="5", generation=1, creationTimestamp="2026-11-23T10:00:00Z")
    if obj["kind"] == "ClusterQueue":
        spec = served["spec"]
        spec["flavorFungibility"] = {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}
        spec["preemption"].update(reclaimWithinCohort="Never", borrowWithinCohort={"policy": "Never"})
        spec["stopPolicy"] = "None"
        served["status"] = {"pendingWorkloads": 3}
    return served


def test_objects_as_the_server_returns_them_need_no_write() -> None:
    wanted = _desired(node("a-gpu", "donor-a", 4, "A100"), namespaces=["jhub-alice"])
    served = plan(wanted, [_as_served(f) for f in wanted.flavors], [_as_served(wanted.cluster_queue)],
                  [_as_served(c) for c in wanted.priority_classes], [_as_served(q) for q in wanted.local_queues])
    assert served.changes == () and served.conflicts == ()
    assert str(served) == "nothing to change"


def test_quotas_compare_as_quantities() -> None:
    assert covers({"nominalQuota": "65536Mi"}, {"nominalQuota": "64Gi"})
    assert not covers({"nominalQuota": "63Gi"}, {"nominalQuota": "64Gi"})
    assert not covers({"name": "1000m"}, {"name": "1"})  # only quotas are quantities


def test_writes_come_in_an_order_kueue_accepts() -> None:
    old = _desired(node("a-gpu", "donor-a", 4, "A100"), node("b-gpu", "donor-b", 2, "T4"))
    new = _desired(node("a-gpu", "donor-a", 4, "A100"), node("c-gpu", "donor-c", 8, "L4"), namespaces=["jhub-bob"])
    steps = plan(new, [_as_served(f) for f in old.flavors], [_as_served(old.cluster_queue)], [])
    assert [(c.verb, c.kind, c.name) for c in steps.changes] == [
        ("create", "ResourceFlavor", "gpuo-donor-c-l4"),  # before the queue names it
        ("create", "WorkloadPriorityClass", "interactive"),
        ("create", "WorkloadPriorityClass", "batch"),
        ("patch", "ClusterQueue", "gpu-offload"),
        ("create", "LocalQueue", "gpu-offload"),
        ("delete", "ResourceFlavor", "gpuo-donor-b-t4"),  # after the queue stopped naming it
    ]
    patch = steps.changes[3].body
    assert patch["metadata"] == {"labels": {"gpu-offload.io/managed-by": "gpu-offload"}}
    assert [f["name"] for f in patch["spec"]["resourceGroups"][0]["flavors"]] == ["gpuo-donor-a-a100",
                                                                                  "gpuo-donor-c-l4"]


def test_flavors_we_did_not_make_are_never_deleted_or_changed() -> None:
    wanted = _desired(node("a-gpu", "donor-a", 4, "A100"))
    theirs = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
              "metadata": {"name": "gpuo-donor-a-a100"}, "spec": {}}
    other = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "on-demand"}}
    steps = plan(wanted, [theirs, other], [_as_served(wanted.cluster_queue)],
                 [_as_served(c) for c in wanted.priority_classes])
    assert steps.changes == ()
    assert steps.conflicts == ("ResourceFlavor gpuo-donor-a-a100 exists and is not managed by gpu-offload: rename "
                               "ours in the queueing settings, or label it gpu-offload.io/managed-by=gpu-offload to "
                               "hand it over",)


def test_a_local_queue_pointing_elsewhere_is_reported_not_recreated() -> None:
    wanted = _desired(node("a-gpu", "donor-a", 4, "A100"), namespaces=["jhub-alice"])
    theirs = copy.deepcopy(wanted.local_queues[0])
    theirs["spec"]["clusterQueue"] = "team-a"
    steps = plan(wanted, [_as_served(f) for f in wanted.flavors], [_as_served(wanted.cluster_queue)],
                 [_as_served(c) for c in wanted.priority_classes], [theirs])
    assert steps.changes == ()
    assert "LocalQueue jhub-alice/gpu-offload queues to 'team-a', not 'gpu-offload'" in steps.conflicts[0]


def test_the_queue_view_reads_kueues_status() -> None:
    from gpu_offload.liqo_peering.queue_view import render_queues

    wanted = _desired(node("a-gpu", "donor-a", 4, "A100"), namespaces=["jhub-alice"])
    queue = _as_served(wanted.cluster_queue)
    queue["status"] = {"pendingWorkloads": 5, "reservingWorkloads": 2, "admittedWorkloads": 2, "flavorsUsage": [
        {"name": "gpuo-donor-a-a100", "resources": [{"name": "nvidia.com/gpu", "total": "3"}]}]}
    local = _as_served(wanted.local_queues[0])
    local["status"] = {"pendingWorkloads": 4, "admittedWorkloads": 1}
    text = render_queues("gpu-offload", queue, wanted.flavors, wanted.priority_classes, [local])
    assert text.splitlines() == [
        "ClusterQueue gpu-offload: 5 pending, 2 reserving, 2 admitted",
        "FLAVOR             CLUSTER  MODEL  GPUS  GPUS USED  CPU  MEMORY",
        "gpuo-donor-a-a100  donor-a  A100   4     3          16   64Gi",
        "",
        "LOCALQUEUE              PENDING  ADMITTED",
        "jhub-alice/gpu-offload  4        1",
        "",
        "priority classes: interactive (1000), batch (100)",
    ]
    assert render_queues("gpu-offload", None, [], [], []).startswith("no ClusterQueue gpu-offload: run")
