"""A fraction of a GPU becomes what the donor advertises, or a refusal that says which donors could take it."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering.errors import CannotShare, InvalidRequest
from gpu_offload.liqo_peering.sharing import GIB, MIB, FractionRequest, GpuOffer, MigProfile, resource_ask

A100 = 80 * GIB
MIG = tuple(MigProfile(n, m * GIB, c) for n, m, c in
            (("1g.10gb", 10, 1 / 7), ("2g.20gb", 20, 2 / 7), ("3g.40gb", 40, 3 / 7), ("7g.80gb", 80, 1.0)))


def test_whole_gpus_ask_for_the_gpu_resource_whatever_the_donor_shares():
    for mode in ("none", "time-slicing", "mps", "mig"):
        ask = resource_ask(FractionRequest(gpus=2), GpuOffer(mode, A100, replicas=4, mig_profiles=MIG))
        assert ask.limits == {"nvidia.com/gpu": 2}
        assert ask.share == 2.0


def test_a_whole_gpu_of_a_memory_isolator_is_one_slot_with_all_of_its_memory():
    # the isolator's nvidia.com/gpu counts slots of a GPU: the GPU's whole memory keeps every other pod off it
    ask = resource_ask(FractionRequest(gpus=1), GpuOffer("memory", A100))
    assert ask.limits == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 80 * 1024}
    assert (ask.share, ask.isolation, ask.mode, ask.memory_limit) == (1.0, "compute and memory", "memory", None)
    assert ask.describe() == ("a whole GPU (memory: 1 nvidia.com/gpu, 81920 nvidia.com/gpumem; isolation: compute "
                              "and memory)")
    with pytest.raises(CannotShare, match="one whole GPU per pod; ask for --gpus 1, or for --gpus 2 on a donor"):
        resource_ask(FractionRequest(gpus=2), GpuOffer("memory", A100))
    with pytest.raises(CannotShare, match="did not say how much one GPU holds"):
        resource_ask(FractionRequest(gpus=1), GpuOffer("memory", None))


@pytest.mark.parametrize(("gpus", "shares"), [(0.5, 2), (0.3, 2), (0.25, 1), (0.9, 4), (0.01, 1)])
def test_time_slicing_asks_for_shares_of_one_gpu(gpus, shares):
    offer = GpuOffer("time-slicing", A100, replicas=4, resource="nvidia.com/gpu.shared")
    ask = resource_ask(FractionRequest(gpus=gpus), offer)
    assert ask.limits == {"nvidia.com/gpu.shared": shares}
    assert ask.share == shares / 4
    assert ask.isolation == "none"
    assert ask.memory_limit is None


def test_mps_caps_memory_at_the_one_share_held():
    ask = resource_ask(FractionRequest(gpus=0.1), GpuOffer("mps", A100, replicas=8))
    assert ask.limits == {"nvidia.com/gpu": 1}
    assert ask.isolation == "compute and memory"
    assert ask.memory_limit == 10 * GIB


@pytest.mark.parametrize("request_", [FractionRequest(gpus=0.25), FractionRequest(gpus=0.1, memory=11 * GIB)])
def test_mps_refuses_more_than_one_share_with_the_fix(request_):
    # NVIDIA's plugin refuses an MPS container asking for two replicas; a pod gets one part of a GPU or none
    with pytest.raises(CannotShare) as caught:
        resource_ask(request_, GpuOffer("mps", A100, replicas=8))
    assert str(caught.value) == ("this donor shares each GPU by MPS as 8 parts of 10 GiB; one pod gets one part; "
                                 "ask for --gpus 1/8 or less, or a donor with time-slicing, MIG or a memory isolator")


def test_gpu_memory_decides_the_share_when_it_is_the_larger_need():
    ask = resource_ask(FractionRequest(gpus=0.1, memory=30 * GIB), GpuOffer("time-slicing", A100, replicas=4))
    assert ask.limits == {"nvidia.com/gpu": 2}  # 30/80 of a GPU is more than a quarter: two of four shares


@pytest.mark.parametrize(("memory", "profile"), [(12, "2g.20gb"), (10, "1g.10gb"), (1, "1g.10gb"), (41, "7g.80gb")])
def test_mig_takes_the_smallest_profile_that_holds_the_memory(memory, profile):
    ask = resource_ask(FractionRequest(gpus=0.01, memory=memory * GIB), GpuOffer("mig", A100, mig_profiles=MIG))
    assert ask.limits == {f"nvidia.com/mig-{profile}": 1}
    assert ask.isolation == "compute and memory"


def test_a_memory_isolator_gets_one_gpu_and_the_memory_in_mib():
    ask = resource_ask(FractionRequest(gpus=0.5, memory=12 * GIB), GpuOffer("memory", 24 * GIB))
    assert ask.limits == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12 * 1024}
    assert ask.memory_limit == 12 * 1024 * MIB
    assert ask.isolation == "memory"


def test_a_donor_that_does_not_share_refuses_a_fraction_and_says_what_to_do():
    with pytest.raises(CannotShare, match=r"whole GPUs only.*--gpus 1"):
        resource_ask(FractionRequest(gpus=0.5), GpuOffer("none", A100))


def test_more_memory_than_one_gpu_holds_is_refused_with_both_sizes():
    with pytest.raises(CannotShare, match=r"100\.0 GiB.*80\.0 GiB"):
        resource_ask(FractionRequest(gpus=0.5, memory=100 * GIB), GpuOffer("mig", A100, mig_profiles=MIG))


def test_gpu_memory_without_a_labelled_gpu_size_is_refused():
    with pytest.raises(CannotShare, match="memory label"):
        resource_ask(FractionRequest(gpus=0.5, memory=8 * GIB), GpuOffer("time-slicing", None, replicas=4))


@pytest.mark.parametrize("gpus", [0, -1, 1.5, float("nan"), float("inf")])
def test_malformed_fractions_are_refused_before_placement(gpus):
    with pytest.raises(InvalidRequest, match="--gpus"):
        FractionRequest(gpus=gpus)
