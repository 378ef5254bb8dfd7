"""Trust per cluster is decided on the origin only: from its admin's configuration, never from the labels a
donor can put on its own virtual node (Liqo copies ResourceSlice ``status.nodeLabels`` onto it)."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.inventory import build_inventory, inventory_from_dict, inventory_to_dict
from gpu_offload.liqo_peering.render import render_table
from gpu_offload.liqo_peering.trust import (
    ClusterPolicy,
    TrustPolicy,
    apply_policy,
    is_trusted,
    policy_from_config,
    policy_from_env,
    run_trusted,
)

from .conftest import foreign_cluster, node, virtual_node

# What a donor can put on its own virtual node: labels that claim trust, and a flattering model and price.
SELF_TRUSTING = {"gpu-offload.io/trusted": "true", "liqo.io/trusted": "true", "trusted": "true"}


def _inventory(**extra_labels: str):  # type: ignore[no-untyped-def]
    return build_inventory(
        [foreign_cluster("donor-1"), foreign_cluster("donor-2")],
        [virtual_node("donor-1-gpu", "donor-1", 4, "H100", **extra_labels)],
        [node("donor-1-gpu", "donor-1", 4, "H100"), node("donor-2-gpu", "donor-2", 8, "L4")],
    )


def test_donors_are_untrusted_whatever_their_labels_say() -> None:
    inventory = apply_policy(_inventory(**SELF_TRUSTING), TrustPolicy())
    assert [(c.cluster_id, c.trusted) for c in inventory.clusters] == [("donor-1", False), ("donor-2", False)]
    assert not is_trusted("donor-1", TrustPolicy())


def test_only_the_origins_configuration_trusts_a_cluster() -> None:
    policy = policy_from_config({"donor-2": {"trusted": True}, "donor-1": {"trusted": False}})
    inventory = apply_policy(_inventory(**SELF_TRUSTING), policy)
    assert {c.cluster_id: c.trusted for c in inventory.clusters} == {"donor-1": False, "donor-2": True}
    # applying another policy decides again from scratch: nothing sticks from an earlier answer
    assert not any(c.trusted for c in apply_policy(inventory, TrustPolicy()).clusters)


def test_a_donor_cannot_pass_its_node_off_as_a_trusted_clusters() -> None:
    # donor-1's Node claims donor-2's id (a label the donor could push); its VirtualNode says whose it is
    claimed = node("donor-1-gpu", "donor-1", 4, "A100")
    claimed["metadata"]["labels"]["liqo.io/remote-cluster-id"] = "donor-2"
    inventory = build_inventory([foreign_cluster("donor-1"), foreign_cluster("donor-2")],
                                [virtual_node("donor-1-gpu", "donor-1", 4, "A100")], [claimed])
    trusted = apply_policy(inventory, policy_from_config({"donor-2": {"trusted": True}}))
    assert {c.cluster_id: ([vn.name for vn in c.virtual_nodes], c.trusted) for c in trusted.clusters} == {
        "donor-1": (["donor-1-gpu"], False), "donor-2": ([], True)}


def test_the_admins_model_and_price_win_over_the_labels() -> None:
    policy = policy_from_config({"donor-1": {"gpuModel": "T4", "pricePerGpuHour": 0.35}})
    (vn,) = apply_policy(_inventory(), policy).cluster("donor-1").virtual_nodes  # type: ignore[union-attr]
    assert (vn.model, vn.price) == ("T4", 0.35)
    # where the admin set nothing, the label stays (shown, but it may come from the donor)
    (other,) = apply_policy(_inventory(), policy).cluster("donor-2").virtual_nodes  # type: ignore[union-attr]
    assert other.model == "L4"


def test_the_local_backend_counts_as_trusted_but_a_donor_calling_itself_local_does_not() -> None:
    assert run_trusted("local", "", TrustPolicy())
    assert not run_trusted("kubernetes", "local", TrustPolicy())  # a donor picks its own cluster id
    assert run_trusted("kubernetes", "donor-1", policy_from_config({"donor-1": {"trusted": True}}))
    local = build_inventory([foreign_cluster("local")], [], [node("local-gpu", "local", 4, "A100")])
    assert not apply_policy(local, TrustPolicy()).clusters[0].trusted


def test_the_environment_variable_names_trusted_clusters() -> None:
    policy = policy_from_env({"GPU_OFFLOAD_TRUSTED_CLUSTERS": " donor-1, ,donor-3 "})
    assert policy.trusted_ids == ("donor-1", "donor-3")
    assert policy_from_env({}).trusted_ids == ()


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"donor-1": {"trusted": "yes"}}, ["donor-1.trusted", "true or false"]),
        ({"donor-1": {"trustd": True}}, ["trustd", "trusted, gpuModel"]),
        ({"donor-1": {"pricePerGpuHour": -1}}, ["pricePerGpuHour", "0 or more"]),
        ({"donor-1": {"pricePerGpuHour": "cheap"}}, ["pricePerGpuHour", "2.5"]),
        ({"donor-1": True}, ["donor-1", "mapping"]),
        (["donor-1"], ["map cluster ids"]),
    ],
    ids=["trusted not a boolean", "misspelt key", "negative price", "price not a number", "entry", "list"],
)
def test_bad_configuration_names_the_entry_and_the_fix(raw: object, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        policy_from_config(raw)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_config_form_is_read_into_typed_settings() -> None:
    policy = policy_from_config({"donor-1": {"trusted": True, "gpuModel": "A100", "pricePerGpuHour": "2.5"},
                                 "donor-2": {}})
    assert policy == TrustPolicy({"donor-1": ClusterPolicy(True, "A100", 2.5), "donor-2": ClusterPolicy()})


def test_the_trusted_field_survives_the_hubs_transport_and_shows_in_the_table() -> None:
    inventory = apply_policy(_inventory(), policy_from_config({"donor-2": {"trusted": True}}))
    back = inventory_from_dict(inventory_to_dict(inventory))
    assert {c.cluster_id: c.trusted for c in back.clusters} == {"donor-1": False, "donor-2": True}
    table = render_table(back).splitlines()
    assert "TRUST" in table[0]
    assert "untrusted" in next(line for line in table if line.startswith("donor-1"))
    assert " trusted" in next(line for line in table if line.startswith("donor-2"))


def test_the_client_and_the_cache_apply_the_origins_policy(origin, monkeypatch: pytest.MonkeyPatch) -> None:
    api = origin.sandbox.api_client()
    try:
        # the sandbox's donors label their virtual nodes as a donor could; only the policy counts
        assert not any(c.trusted for c in LiqoClient(api).read_inventory().clusters)
        monkeypatch.setenv("GPU_OFFLOAD_TRUSTED_CLUSTERS", "donor-2")
        from_env = LiqoClient(api)
        assert {c.cluster_id: c.trusted for c in from_env.read_inventory().clusters} == {
            "donor-1": False, "donor-2": True}
        configured = LiqoClient(api, trust=policy_from_config({"donor-1": {"trusted": True, "gpuModel": "T4"}}))
        cache = InventoryCache(configured).start()
        try:
            inventory = cache.inventory(timeout=30)
        finally:
            cache.close()
        assert {c.cluster_id: c.trusted for c in inventory.clusters} == {"donor-1": True, "donor-2": False}
        assert {vn.cluster_id: vn.model for vn in inventory.virtual_nodes} == {"donor-1": "T4", "donor-2": "L4"}
    finally:
        api.close()


def test_trusted_only_placement_skips_untrusted_clusters_and_says_how_to_trust_one() -> None:
    from gpu_offload.liqo_peering.errors import NoFit
    from gpu_offload.liqo_peering.placement import PlacementRequest, place

    inventory = _inventory(**SELF_TRUSTING)  # donor-2 has the most free GPUs, and claims trust by label
    assert place(apply_policy(inventory, TrustPolicy()), PlacementRequest()).cluster_id == "donor-2"
    trusting_1 = apply_policy(inventory, policy_from_config({"donor-1": {"trusted": True}}))
    assert place(trusting_1, PlacementRequest(trusted_only=True)).cluster_id == "donor-1"
    with pytest.raises(NoFit, match=r"no peered cluster is trusted \(donor-1, donor-2 are untrusted\): ask your "
                       r"admin to trust one \(the chart's clusters.<id>.trusted; outside a hub "
                       r"GPU_OFFLOAD_TRUSTED_CLUSTERS\)"):
        place(apply_policy(inventory, TrustPolicy()), PlacementRequest(trusted_only=True))
    with pytest.raises(NoFit, match="cluster donor-2 is not trusted"):
        place(trusting_1, PlacementRequest(cluster="donor-2", trusted_only=True))
