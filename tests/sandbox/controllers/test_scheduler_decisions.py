"""kube-scheduler's filters as the sandbox applies them, and the FailedScheduling wording users read."""

from __future__ import annotations

from decimal import Decimal

import pytest
from gpu_offload.sandbox.apiserver.matching import quantity
from gpu_offload.sandbox.controllers import scheduler
from gpu_offload.sandbox.liqo import offloading
from gpu_offload.sandbox.liqo import seed as liqo


def _pod(gpus: int = 0, cpu: str = "100m", tolerate_liqo: bool = False, **spec) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    pod_spec = {"containers": [{"name": "c", "image": "python:3.11",
                                "resources": {"requests": {"cpu": cpu}, "limits": limits}}], **spec}
    if tolerate_liqo:
        pod_spec["tolerations"] = [dict(offloading.VIRTUAL_NODE_TOLERATION)]
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": pod_spec}


def _cluster(donor_count: int = 1, gpus: int = 4) -> list[dict]:
    return [o for o in liqo.topology(liqo.donors(donor_count, gpus=gpus)) if o["kind"] == "Node"]


def test_gpu_pod_without_toleration_gets_the_real_failed_scheduling_message():
    decision = scheduler.decide(_pod(gpus=1), _cluster(1), [])
    assert decision.node is None
    assert decision.message == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {virtual-node.liqo.io/not-allowed: true}, "
        "2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
        "1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod.")


def test_tolerating_gpu_pod_lands_on_the_virtual_node():
    assert scheduler.decide(_pod(gpus=2, tolerate_liqo=True), _cluster(1), []).node == "donor-1-gpu"


def test_plain_pod_lands_on_a_local_node():
    assert scheduler.decide(_pod(), _cluster(2), []).node in (liqo.CORE_NODE, liqo.USER_NODE)


def test_gpus_already_requested_count_and_the_least_used_donor_wins():
    nodes = _cluster(2, gpus=4)
    running = _pod(gpus=3, tolerate_liqo=True)
    running["spec"]["nodeName"] = "donor-1-gpu"
    assert scheduler.decide(_pod(gpus=2, tolerate_liqo=True), nodes, [running]).node == "donor-2-gpu"
    other = _pod(gpus=3, tolerate_liqo=True)
    other["spec"]["nodeName"] = "donor-2-gpu"
    decision = scheduler.decide(_pod(gpus=2, tolerate_liqo=True), nodes, [running, other])
    assert decision.node is None
    assert decision.message.startswith("0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
    # a finished pod gives its GPUs back
    other["status"] = {"phase": "Succeeded"}
    assert scheduler.decide(_pod(gpus=2, tolerate_liqo=True), nodes, [running, other]).node == "donor-2-gpu"


def test_node_selector_and_required_affinity_filter_nodes():
    nodes = _cluster(2)
    pod = _pod(gpus=1, tolerate_liqo=True, nodeSelector={"liqo.io/remote-cluster-id": "donor-2"})
    assert scheduler.decide(pod, nodes, []).node == "donor-2-gpu"
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": liqo.GPU_MODEL_LABEL, "operator": "In", "values": ["H100"]}]}]}}}
    decision = scheduler.decide(_pod(gpus=1, tolerate_liqo=True, affinity=affinity), nodes, [])
    assert decision.node is None
    assert "4 node(s) didn't match Pod's node affinity/selector" in decision.message


def test_cordoned_node_is_skipped():
    nodes = _cluster(1)
    nodes[-1]["spec"]["unschedulable"] = True
    decision = scheduler.decide(_pod(gpus=1, tolerate_liqo=True), nodes, [])
    assert "1 node(s) were unschedulable" in decision.message


def test_cpu_and_memory_are_checked():
    decision = scheduler.decide(_pod(cpu="64"), _cluster(0), [])
    assert decision.message.startswith("0/2 nodes are available: 2 Insufficient cpu.")


def test_webhook_mutated_pod_goes_only_where_the_cluster_selector_points():
    nodes = _cluster(2)
    nsoff = {"podOffloadingStrategy": "Remote", "clusterSelector": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-2"]}]}]}}
    pod = offloading.mutate_pod(_pod(gpus=1), nsoff)
    assert scheduler.decide(pod, nodes, []).node == "donor-2-gpu"
    assert scheduler.decide(offloading.mutate_pod(_pod(), nsoff), nodes, []).node == "donor-2-gpu"


def test_requests_default_to_limits_and_init_containers_take_the_max():
    pod = _pod(gpus=2)
    pod["spec"]["initContainers"] = [{"name": "i", "image": "x", "resources": {"limits": {"cpu": "3"}}}]
    assert scheduler.pod_requests(pod) == {"cpu": Decimal(3), "nvidia.com/gpu": Decimal(2)}


def test_quantities_parse_like_kubernetes_and_bad_ones_say_how_to_write_them():
    assert quantity("500m") == Decimal("0.5")
    assert quantity("1Gi") == 2**30
    assert quantity("1e3") == 1000
    with pytest.raises(ValueError, match="write e.g. 500m"):
        quantity("12 cores")
