"""Liqo's namespace-offloading rules as the sandbox applies them."""

from __future__ import annotations

from gpu_offload.sandbox.liqo import offloading
from gpu_offload.sandbox.liqo import seed as liqo


def _nsoff(name: str = "offloading", **spec) -> dict:
    return {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": name, "namespace": "team-a", "generation": 1}, "spec": spec}


def test_only_a_namespace_offloading_named_offloading_is_accepted():
    assert offloading.namespace_offloading_problem(_nsoff()) is None
    problem = offloading.namespace_offloading_problem(_nsoff("my-offload"))
    assert problem is not None and '"my-offload"' in problem and 'named "offloading"' in problem


def test_pods_get_the_toleration_and_the_cluster_selector_anded_with_their_own_affinity():
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": liqo.GPU_MODEL_LABEL, "operator": "In", "values": ["A100"]}]}]}
    own = {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-1"]}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [own]}]}}}}}
    mutated = offloading.mutate_pod(pod, {"podOffloadingStrategy": "Remote", "clusterSelector": selector})
    assert mutated["spec"]["tolerations"] == [
        {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}]
    terms = mutated["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [own, selector["nodeSelectorTerms"][0]["matchExpressions"][0],
                                           {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}]}]
    assert "tolerations" not in pod["spec"], "the input pod must not be modified"


def test_local_and_remote_allows_local_nodes_too_and_local_leaves_the_pod_as_it_is():
    # as real Liqo 1.2's webhook does (tests/realcluster/test_real_liqo.py): the cluster selector's terms as they
    # are, or any of the local nodes; with no selector every node is allowed already and nothing is imposed
    donor = {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-1"]}]}
    both = offloading.offloading_terms({"clusterSelector": {"nodeSelectorTerms": [donor]}})
    assert both == [donor, {"matchExpressions": [{"key": "liqo.io/type", "operator": "NotIn",
                                                  "values": ["virtual-node"]}]}]
    assert offloading.offloading_terms({}) == []
    plain = {"spec": {"containers": []}}
    assert "affinity" not in offloading.mutate_pod(plain, {"podOffloadingStrategy": "LocalAndRemote"})["spec"]
    # Liqo's mutatePod returns at once for Local: no toleration, no affinity, the pod's own kept
    own = {"spec": {"tolerations": [{"key": "x", "operator": "Exists"}], "nodeSelector": {"a": "b"}}}
    assert offloading.mutate_pod(own, {"podOffloadingStrategy": "Local"}) == own


def test_status_is_ready_when_a_virtual_node_is_selected_and_names_the_remote_namespace():
    nodes = [o for o in liqo.topology(liqo.donors(2)) if o["kind"] == "Node"]
    status = offloading.offloading_status(_nsoff(), nodes, "2026-11-22T00:00:00Z")
    assert status["offloadingPhase"] == "Ready"
    assert status["remoteNamespaceName"] == "team-a-origin"
    assert sorted(status["remoteNamespacesConditions"]) == ["donor-1", "donor-2"]
    none = _nsoff(clusterSelector={"nodeSelectorTerms": [{"matchExpressions": [
        {"key": liqo.GPU_MODEL_LABEL, "operator": "In", "values": ["TPU"]}]}]})
    assert offloading.offloading_status(none, nodes, "t")["offloadingPhase"] == "NoClusterSelected"


def test_backoff_status_says_how_to_offload_the_namespace():
    status = offloading.offloading_backoff_status({"metadata": {"namespace": "plain"}}, "donor-1-gpu")
    assert status["phase"] == "Pending" and status["reason"] == "OffloadingBackOff"
    assert 'NamespaceOffloading named "offloading"' in status["message"]
