"""Placing a fraction of a GPU on virtual nodes whose donors share GPUs in different ways."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import NoFit
from gpu_offload.liqo_peering.inventory import build_inventory, inventory_from_dict, inventory_to_dict
from gpu_offload.liqo_peering.placement import PlacementRequest, place, place_one
from gpu_offload.liqo_peering.sharing import GIB, FractionRequest


def _fc(cid: str) -> dict:
    ok = [{"type": "Ready", "status": "Ready"}]
    return {"metadata": {"name": cid}, "spec": {"clusterID": cid},
            "status": {"role": "Provider", "modules": {m: {"enabled": True, "conditions": ok}
                                                       for m in ("offloading", "authentication", "networking")}}}


def _node(cid: str, mode: str, resources: dict[str, str], replicas: int = 1, price: str = "2") -> dict:
    labels = {L.TYPE_LABEL: L.TYPE_VIRTUAL_NODE, L.REMOTE_CLUSTER_ID_LABEL: cid, L.GPU_MODEL: "A100",
              L.GPU_MEMORY: "80Gi", L.GPU_SHARING: mode, L.GPU_REPLICAS: str(replicas), L.PRICE_PER_GPU_HOUR: price}
    alloc = {"cpu": "32", "memory": "128Gi", **resources}
    return {"metadata": {"name": f"{cid}-gpu", "labels": labels},
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(node: str, limits: dict[str, str], phase: str = "Running") -> dict:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}]},
            "status": {"phase": phase}}


DONORS = {
    "whole": ("none", {"nvidia.com/gpu": "4"}, 1),
    "sliced": ("time-slicing", {"nvidia.com/gpu.shared": "16"}, 4),
    "mps": ("mps", {"nvidia.com/gpu.shared": "8"}, 4),
    "mig": ("mig", {"nvidia.com/mig-1g.10gb": "3", "nvidia.com/mig-3g.40gb": "1"}, 1),
    "hami": ("memory", {"nvidia.com/gpu": "20", "nvidia.com/gpumem": str(2 * 80 * 1024)}, 1),
}


def _inventory(names: tuple[str, ...], pods: tuple[dict, ...] = ()):
    nodes = [_node(n, *DONORS[n][:2], replicas=DONORS[n][2]) for n in names]
    return build_inventory([_fc(n) for n in names], (), nodes, pods)


def _half(memory: int | None = None, gpus: float = 0.5) -> PlacementRequest:
    return PlacementRequest(1, fraction=FractionRequest(gpus, memory))


def test_half_a_gpu_goes_to_a_sharing_donor_and_asks_for_its_shares():
    choice = place(_inventory(("whole", "sliced")), _half())
    assert choice.cluster_id == "sliced"
    fragment = choice.scheduling_fragment()
    assert fragment["resources"] == {"limits": {"nvidia.com/gpu.shared": "2"}}
    assert choice.ask is not None and choice.ask.share == 0.5 and choice.ask.isolation == "none"


def test_a_donor_that_lends_whole_gpus_refuses_with_the_fix():
    with pytest.raises(NoFit) as caught:
        place(_inventory(("whole",)), _half())
    assert "whole: this donor lends whole GPUs only" in str(caught.value)
    assert "--gpus 1" in str(caught.value)


def test_each_mode_gets_its_own_ask():
    mps = place(_inventory(("mps",)), _half(gpus=0.25))
    assert mps.ask is not None and mps.ask.limits == {"nvidia.com/gpu.shared": 1}
    assert mps.ask.isolation == "compute and memory" and mps.ask.memory_limit == 20 * GIB
    mig = place(_inventory(("mig",)), _half(memory=8 * GIB, gpus=1))
    assert mig.ask is not None and mig.ask.limits == {"nvidia.com/mig-1g.10gb": 1}
    hami = place(_inventory(("hami",)), _half(memory=12 * GIB, gpus=1))
    assert hami.ask is not None and hami.ask.limits == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12 * 1024}
    assert hami.ask.isolation == "memory"


def test_shares_in_use_are_counted_and_a_full_donor_says_so():
    pods = tuple(_pod("mps-gpu", {"nvidia.com/gpu.shared": "1"}) for _ in range(8))  # 8 of 8 shares held
    with pytest.raises(NoFit) as caught:
        place(_inventory(("mps",), pods), _half(gpus=0.25))
    assert "no cluster has room for 0.25 of a GPU right now" in str(caught.value)
    finished = tuple(_pod("mps-gpu", {"nvidia.com/gpu.shared": "1"}, "Succeeded") for _ in range(8))
    assert place(_inventory(("mps",), finished), _half(gpus=0.25)).cluster_id == "mps"


def test_more_than_one_mps_share_goes_to_another_donor_or_is_refused_with_every_reason():
    assert place(_inventory(("mps", "sliced")), _half()).cluster_id == "sliced"
    with pytest.raises(NoFit) as caught:
        place(_inventory(("mps", "whole")), _half())
    said = str(caught.value)
    assert ("mps: this donor shares each GPU by MPS as 4 parts of 20 GiB; one pod gets one part; ask for --gpus 1/4 "
            "or less") in said
    assert "whole: this donor lends whole GPUs only" in said


def test_fractions_pack_onto_the_fuller_donor():
    pods = (_pod("sliced-gpu", {"nvidia.com/gpu.shared": "14"}),)  # 2 of 16 shares left on 'sliced'
    inventory = build_inventory([_fc("mps"), _fc("sliced")], (), [
        _node("mps", "mps", {"nvidia.com/gpu.shared": "8"}, 4), _node("sliced", "time-slicing",
                                                                      {"nvidia.com/gpu.shared": "16"}, 4)], pods)
    assert place(inventory, _half(gpus=0.25)).cluster_id == "sliced"  # one share fits either; 'sliced' is fuller


def test_whole_gpu_requests_skip_donors_whose_gpu_resource_counts_shares():
    inventory = _inventory(("hami", "whole"))
    assert place(inventory, PlacementRequest(2)).cluster_id == "whole"
    record = next(vn for vn in inventory.virtual_nodes if vn.cluster_id == "hami")
    assert record.free == 0 and record.device_free("nvidia.com/gpumem") == 160 * 1024


def test_the_sharing_fields_survive_the_hubs_json():
    inventory = _inventory(("sliced",))
    again = inventory_from_dict(__import__("json").loads(__import__("json").dumps(inventory_to_dict(inventory))))
    assert again.virtual_nodes == inventory.virtual_nodes
    assert place(again, _half()).ask == place(inventory, _half()).ask


def test_a_forged_sharing_label_is_an_inventory_error_not_a_guess():
    bad = _node("sliced", "time-slicing", {"nvidia.com/gpu.shared": "16"}, 4)
    bad["metadata"]["labels"][L.GPU_REPLICAS] = "99999999"
    inventory = build_inventory([_fc("sliced")], (), [bad], ())
    assert not inventory.virtual_nodes
    assert any(L.GPU_REPLICAS in e for e in inventory.errors)


def test_a_whole_gpu_goes_to_a_memory_isolator_once_no_donor_lending_whole_gpus_has_room():
    full = tuple(_pod("whole-gpu", {"nvidia.com/gpu": "1"}) for _ in range(4))
    assert place_one(_inventory(("whole", "hami")), PlacementRequest(1)).cluster_id == "whole"  # whole first
    choice = place_one(_inventory(("whole", "hami"), full), PlacementRequest(1))
    assert choice.cluster_id == "hami" and choice.gpus == 1
    assert choice.scheduling_fragment()["resources"] == {"limits": {"nvidia.com/gpu": "1",
                                                                    "nvidia.com/gpumem": str(80 * 1024)}}
    # both of the isolator's GPUs held whole: the whole-GPU refusal stands, as for two GPUs in one pod
    held = full + tuple(_pod("hami-gpu", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(80 * 1024)})
                        for _ in range(2))
    with pytest.raises(NoFit) as caught:
        place_one(_inventory(("whole", "hami"), held), PlacementRequest(1))
    with pytest.raises(NoFit) as before:
        place(_inventory(("whole", "hami"), held), PlacementRequest(1))
    assert str(caught.value) == str(before.value)
    with pytest.raises(NoFit):
        place_one(_inventory(("whole", "hami"), full), PlacementRequest(2))
