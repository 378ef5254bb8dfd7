"""Placement policies, request checks, no-fit messages and the scheduling fragment."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering.errors import InvalidRequest, NoFit, UnknownCluster, UnknownModel
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord
from gpu_offload.liqo_peering.placement import (
    POLICIES,
    BinPack,
    FirstFit,
    MostFree,
    PlacementRequest,
    place,
    place_pods,
    scheduling_fragment,
)


def vn(name: str, cluster: str, free: int, model: str | None, price: float | None = None, **kw) -> VirtualNodeRecord:
    return VirtualNodeRecord(name, cluster, capacity=8, allocatable=free + 1, in_use=1, model=model, price=price, **kw)


def inv(*nodes: VirtualNodeRecord, down: tuple[str, ...] = ()) -> Inventory:
    clusters = sorted({n.cluster_id for n in nodes})
    return Inventory(tuple(
        ClusterRecord(c, c, "Provider", "down" if c in down else "healthy", "offloading broken" if c in down else "",
                      tuple(n for n in nodes if n.cluster_id == c))
        for c in clusters
    ))


def test_most_free_of_the_requested_model() -> None:
    got = place(inv(vn("b1", "b", 2, "A100"), vn("c1", "c", 6, "A100"), vn("d1", "d", 8, "L4")), PlacementRequest(1, "A100"))
    assert (got.virtual_node, got.cluster_id, got.model, got.fallback) == ("c1", "c", "A100", False)


def test_cheapest_on_ties_unpriced_last() -> None:
    nodes = inv(vn("b1", "b", 4, "A100", 3.0), vn("c1", "c", 4, "A100", 1.5), vn("d1", "d", 4, "A100"))
    assert place(nodes, PlacementRequest(2, "A100")).cluster_id == "c"


def test_model_match_is_case_insensitive_and_any_model_when_none() -> None:
    nodes = inv(vn("b1", "b", 2, "A100"), vn("c1", "c", 6, "L4"))
    assert place(nodes, PlacementRequest(1, "a100")).virtual_node == "b1"
    assert place(nodes, PlacementRequest(1)).virtual_node == "c1"


@pytest.mark.parametrize("kw", [{"cordoned": True}, {"ready": False}])
def test_cordoned_and_not_ready_nodes_are_skipped(kw) -> None:
    nodes = inv(vn("big", "b", 8, "A100", **kw), vn("small", "c", 1, "A100"))
    assert place(nodes, PlacementRequest(1, "A100")).virtual_node == "small"


def test_down_clusters_are_skipped_and_named_when_nothing_is_left() -> None:
    nodes = inv(vn("big", "b", 8, "A100"), vn("small", "c", 1, "A100"), down=("b",))
    assert place(nodes, PlacementRequest(1, "A100")).virtual_node == "small"
    with pytest.raises(NoFit) as err:
        place(inv(vn("big", "b", 8, "A100"), down=("b",)), PlacementRequest(1, "A100"))
    assert "down: b (down: offloading broken)" in str(err.value)


def test_fallback_models_in_order() -> None:
    nodes = inv(vn("b1", "b", 1, "A100"), vn("c1", "c", 8, "L4"), vn("d1", "d", 8, "T4"))
    got = place(nodes, PlacementRequest(4, "A100", fallback_models=("T4", "L4")))
    assert (got.virtual_node, got.model, got.fallback) == ("d1", "T4", True)


def test_no_fit_says_what_exists() -> None:
    nodes = inv(vn("b1", "donor-b", 2, "A100"), vn("c1", "donor-c", 8, "L4"))
    with pytest.raises(NoFit) as err:
        place(nodes, PlacementRequest(4, "A100"))
    assert str(err.value) == (
        "no cluster has 4 free A100; donor-b has 2 free A100, donor-c 8 free L4 (use --gpu-model L4 or --gpus 2)"
    )
    assert err.value.alternatives == (("donor-b", "A100", 2), ("donor-c", "L4", 8))


def test_no_fit_on_a_named_cluster() -> None:
    nodes = inv(vn("b1", "donor-b", 2, "A100"), vn("c1", "donor-c", 8, "A100"))
    with pytest.raises(NoFit, match=r"^cluster donor-b does not have 4 free A100; donor-b has 2 free A100 \(use --gpus 2\)$"):
        place(nodes, PlacementRequest(4, "A100", cluster="donor-b"))


def test_nothing_free_anywhere() -> None:
    with pytest.raises(NoFit, match="no cluster has 1 free GPU; no GPU is free anywhere right now"):
        place(inv(vn("b1", "b", 0, "A100")), PlacementRequest(1))


def test_unknown_cluster_lists_valid_ones() -> None:
    with pytest.raises(UnknownCluster) as err:
        place(inv(vn("b1", "donor-b", 2, "A100"), vn("c1", "donor-c", 8, "L4")), PlacementRequest(1, cluster="donor-z"))
    assert str(err.value) == "no peered cluster 'donor-z'; valid: donor-b, donor-c or 'auto'"


def test_unknown_model_lists_valid_ones_fallbacks_too() -> None:
    nodes = inv(vn("b1", "b", 2, "A100"), vn("c1", "c", 8, "L4"))
    with pytest.raises(UnknownModel) as err:
        place(nodes, PlacementRequest(1, "A100", fallback_models=("H200",)))
    assert str(err.value).startswith("no virtual node has GPU model 'H200'; models: A100, L4")
    assert err.value.valid == ("A100", "L4")


@pytest.mark.parametrize(
    "kw, text",
    [({"gpus": 0}, "gpus=0"), ({"gpus": 1.5}, "gpus=1.5"), ({"gpus": True}, "gpus=True"),
     ({"fallback_models": ("L4",)}, "without a GPU model"), ({"cluster": ""}, "cluster is empty")],
)
def test_bad_requests(kw, text) -> None:
    with pytest.raises(InvalidRequest, match=text):
        PlacementRequest(**kw)


def test_alternative_policies() -> None:
    nodes = [vn("b1", "b", 2, "A100"), vn("c1", "c", 6, "A100"), vn("a1", "a", 4, "A100")]
    assert MostFree().choose(nodes, 2).name == "c1"
    assert BinPack().choose(nodes, 2).name == "b1"
    assert FirstFit().choose(nodes, 2).name == "a1"
    assert place(inv(*nodes), PlacementRequest(3, "A100"), BinPack()).virtual_node == "a1"
    assert set(POLICIES) == {"most-free", "bin-pack", "first-fit"}


def test_a_custom_policy_plugs_in_and_gets_only_fitting_candidates() -> None:
    seen = []

    class Priciest:
        name = "priciest"

        def choose(self, candidates, gpus):
            seen.extend(candidates)
            return max(candidates, key=lambda v: v.price or 0)

    nodes = inv(vn("b1", "b", 2, "A100", 1.0), vn("c1", "c", 6, "A100", 9.0), vn("d1", "d", 6, "A100", 5.0, cordoned=True))
    assert place(nodes, PlacementRequest(2, "A100"), Priciest()).virtual_node == "c1"
    assert {v.name for v in seen} == {"b1", "c1"}


def test_scheduling_fragment(k8s_schema) -> None:
    got = place(inv(vn("c1", "donor-c", 6, "A100")), PlacementRequest(2, "A100"))
    fragment = got.scheduling_fragment()
    assert fragment == scheduling_fragment("donor-c", 2) == {
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
        "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-c"]},
                {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]},
            ]}
        ]}}},
    }
    k8s_schema({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "python:3.11", "resources": fragment["resources"]}],
        "tolerations": fragment["tolerations"], "affinity": fragment["affinity"]}})


def test_no_fit_message_stays_short_with_many_clusters_wanted_model_first() -> None:
    nodes = [vn(f"n{i}", f"donor-{i:02d}", 1 + i % 3, "L4" if i % 2 else "A100") for i in range(40)]
    with pytest.raises(NoFit) as err:
        place(inv(*nodes), PlacementRequest(8, "A100"))
    text = str(err.value)
    assert text.startswith("no cluster has 8 free A100; donor-02 has 3 free A100, ")
    assert " and 35 more (gpu-offload clusters lists them)" in text
    assert text.endswith("(use --gpus 3)")
    assert len(err.value.alternatives) == 40


def test_a_retry_avoids_the_cluster_that_lost_its_node() -> None:
    nodes = inv(vn("b1", "b", 8, "A100"), vn("c1", "c", 2, "A100"))
    assert place(nodes, PlacementRequest(1, "A100")).cluster_id == "b"
    assert place(nodes, PlacementRequest(1, "A100"), avoid={"b"}).cluster_id == "c"
    with pytest.raises(NoFit, match="^no cluster has 4 free A100; c has 2 free A100"):
        place(nodes, PlacementRequest(4, "A100"), avoid={"b"})


def test_nodes_without_the_memory_or_cpu_asked_for_are_skipped_and_unknown_counts_as_enough() -> None:
    nodes = inv(vn("small", "a", 8, "L4", memory_free=16 * 2**30, cpu_free=4000),
                vn("roomy", "b", 2, "L4", memory_free=256 * 2**30, cpu_free=64000),
                vn("unknown", "c", 1, "L4"))
    assert place(nodes, PlacementRequest(1, "L4")).virtual_node == "small"
    assert place(nodes, PlacementRequest(1, "L4", memory=64 * 2**30)).virtual_node == "roomy"
    assert place(nodes, PlacementRequest(1, "L4", cpu=8000)).virtual_node == "roomy"
    assert place(nodes, PlacementRequest(1, "L4", memory=512 * 2**30)).virtual_node == "unknown"


def test_no_room_says_what_was_asked_and_the_most_that_is_free() -> None:
    nodes = inv(vn("small", "a", 8, "L4", memory_free=16 * 2**30, cpu_free=4000),
                vn("roomy", "b", 2, "L4", memory_free=48 * 2**30, cpu_free=64000))
    with pytest.raises(NoFit) as err:
        place(nodes, PlacementRequest(2, "L4", memory=64 * 2**30, cpu=2000))
    message = str(err.value)
    assert message.startswith("no cluster has 2 free L4 with 64.0 GiB of memory and 2 CPUs: 2 node(s) have the L4")
    assert "at most 48.0 GiB of memory free (b)" in message and "CPUs free" not in message
    assert "GPU_OFFLOAD_MEMORY" in message
    with pytest.raises(NoFit) as err:  # no node has the GPUs at all: the usual no-fit message, not this one
        place(nodes, PlacementRequest(9, "L4", memory=64 * 2**30))
    assert str(err.value) == "no cluster has 9 free L4; a has 8 free L4, b 2 free L4 (use --gpus 8)"


def test_pods_that_may_span_clusters_stay_on_one_node_when_one_holds_them_all() -> None:
    nodes = inv(vn("b1", "b", 4, "A100"), vn("c1", "c", 6, "A100"))
    [only] = place_pods(nodes, PlacementRequest(2, "A100"), 3)
    assert (only.cluster_id, only.gpus) == ("c", 6)


def test_pods_that_fit_no_one_node_go_to_the_fewest_clusters_that_together_hold_them() -> None:
    # 4 pods of 2: c holds 3, d 2, b 1; most-free takes c first, then d for the last one
    nodes = inv(vn("b1", "b", 2, "A100"), vn("c1", "c", 7, "A100"), vn("d1", "d", 4, "A100"))
    got = place_pods(nodes, PlacementRequest(2, "A100"), 4)
    assert [(c.cluster_id, c.gpus) for c in got] == [("c", 6), ("d", 2)]
    assert sum(c.gpus for c in got) == 8
    # a retry avoids the first clusters, and the rest hold only 3 of the 4 pods
    with pytest.raises(NoFit, match="there is room for 3 of the 4 pods \\(d, b\\)$"):
        place_pods(nodes, PlacementRequest(2, "A100"), 4, avoid={"c"})


def test_a_pod_template_for_several_clusters_allows_each_of_them(k8s_schema) -> None:
    fragment = scheduling_fragment(("east", "west"), 4)
    terms = fragment["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["east", "west"]},
        {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}]}]
    k8s_schema({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "python:3.11", "resources": fragment["resources"]}],
        "tolerations": fragment["tolerations"], "affinity": fragment["affinity"]}})
    with pytest.raises(InvalidRequest, match="no cluster id"):
        scheduling_fragment((), 1)


def test_a_cpu_only_request_goes_where_the_most_cpu_is_free_whatever_gpus_are_free() -> None:
    nodes = inv(vn("b1", "b", 0, "A100", cpu_free=8000, memory_free=2**34),
                vn("c1", "c", 6, "A100", cpu_free=2000, memory_free=2**36),
                vn("d1", "d", 8, "L4", cpu_free=None), vn("e1", "e", 4, "L4", cpu_free=16000, cordoned=True))
    got = place(nodes, PlacementRequest(0, cpu_only=True))
    assert (got.virtual_node, got.gpus) == ("b1", 0)  # no free GPU there, and none needed
    # memory decides between equal CPU; a node that does not say how much it has comes last
    tie = inv(vn("b1", "b", 4, "A100", cpu_free=8000, memory_free=2**33),
              vn("c1", "c", 4, "A100", cpu_free=8000, memory_free=2**35), vn("a1", "a", 4, "A100"))
    assert place(tie, PlacementRequest(0, cpu_only=True)).virtual_node == "c1"
    # memory asked for (N pods' worth) skips nodes without it, with the usual message
    with pytest.raises(NoFit, match=r"no cluster has a ready virtual node with 64.0 GiB of memory"):
        place(inv(*tie.virtual_nodes[1:]), PlacementRequest(0, cpu_only=True, memory=2**36))


def test_cpu_only_is_said_on_purpose_and_fails_without_a_usable_node() -> None:
    with pytest.raises(InvalidRequest, match="gpus=2 with cpu_only"):
        PlacementRequest(2, cpu_only=True)
    with pytest.raises(NoFit, match=r"^no cluster has a ready virtual node; down: b \(down: offloading broken\)"):
        place(inv(vn("b1", "b", 4, "A100"), down=("b",)), PlacementRequest(0, cpu_only=True))


def test_the_scheduling_fragment_of_cpu_ranks_asks_for_no_gpu_but_keeps_liqos_toleration() -> None:
    fragment = scheduling_fragment("donor-c", 0)
    assert fragment["resources"] == {}
    assert fragment["tolerations"] == scheduling_fragment("donor-c", 1)["tolerations"]
    assert fragment["affinity"] == scheduling_fragment("donor-c", 1)["affinity"]
