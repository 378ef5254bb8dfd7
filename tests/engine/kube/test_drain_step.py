"""What a warm session's next cell does when its node is cordoned (its donor is being drained): move first, or run
where it is saying why (``drain.drain_step``), on literal inventory records."""

from __future__ import annotations

from dataclasses import replace

from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord

from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.drain import DrainStep, drain_step

SESSION = RunRequest(gpus=1)
WHY = "donor donor-1 is being drained (its node donor-1-gpu is cordoned)"


def node(name: str, cluster: str, free: int = 4, cordoned: bool = False, ready: bool = True,
         model: str | None = "A100") -> VirtualNodeRecord:
    return VirtualNodeRecord(name, cluster, capacity=4, allocatable=4, in_use=4 - free, model=model,
                             cordoned=cordoned, ready=ready)


def pool(*nodes: VirtualNodeRecord, down: str = "") -> Inventory:
    clusters = {vn.cluster_id for vn in nodes}
    return Inventory(tuple(ClusterRecord(c, c, "Provider", "down" if c == down else "healthy",
                                         virtual_nodes=tuple(vn for vn in nodes if vn.cluster_id == c))
                           for c in sorted(clusters)))


HERE = node("donor-1-gpu", "donor-1", free=3, cordoned=True)


def test_a_session_on_a_cordoned_node_moves_when_another_donor_has_room() -> None:
    assert drain_step("donor-1-gpu", SESSION, pool(HERE, node("donor-2-gpu", "donor-2")), None) == DrainStep(True, WHY)


def test_a_session_whose_node_is_not_cordoned_or_unknown_does_nothing() -> None:
    other = node("donor-2-gpu", "donor-2")
    assert drain_step("donor-1-gpu", SESSION, pool(replace(HERE, cordoned=False), other), None) is None
    assert drain_step("gone-gpu", SESSION, pool(HERE, other), None) is None


def test_it_stays_and_says_so_when_nowhere_else_fits() -> None:
    full = node("donor-2-gpu", "donor-2", free=0)
    for elsewhere in (pool(HERE, full),  # no GPU free
                      pool(HERE, node("donor-2-gpu", "donor-2", cordoned=True)),  # drained too
                      pool(HERE, node("donor-2-gpu", "donor-2", ready=False)),
                      pool(HERE, node("donor-2-gpu", "donor-2"), down="donor-2"),
                      pool(HERE, node("donor-2-gpu", "donor-2", model="L4"))):  # another model than asked
        step = drain_step("donor-1-gpu", replace(SESSION, gpu_model="A100"), elsewhere, None)
        assert step == DrainStep(False, WHY, (
            f"{WHY}, and no other donor has room for this session (--gpus 1): the cell runs there; when its pod is "
            "evicted the session's state is checkpointed and its next cell resumes it elsewhere")), elsewhere
    # a second model the session takes, or two GPUs free where it asks two, fit
    assert drain_step("donor-1-gpu", replace(SESSION, gpu_model="A100", fallback_models=("L4",)),
                      pool(HERE, node("donor-2-gpu", "donor-2", model="L4")), None).move  # type: ignore[union-attr]
    assert not drain_step("donor-1-gpu", replace(SESSION, gpus=2),
                          pool(HERE, node("donor-2-gpu", "donor-2", free=1)), None).move  # type: ignore[union-attr]


def test_a_session_pinned_to_its_cluster_moves_only_to_another_node_of_it() -> None:
    pinned = replace(SESSION, cluster="donor-1")
    assert not drain_step("donor-1-gpu", pinned, pool(HERE, node("donor-2-gpu", "donor-2")), None).move  # type: ignore[union-attr]
    assert drain_step("donor-1-gpu", pinned, pool(HERE, node("donor-1-gpu-b", "donor-1")), None) == DrainStep(True, WHY)


def test_a_session_that_is_not_checkpointed_stays_and_says_its_variables_go_with_the_pod() -> None:
    step = drain_step("donor-1-gpu", SESSION, pool(HERE, node("donor-2-gpu", "donor-2")),
                      "this kernel has no object storage to checkpoint to")
    assert step == DrainStep(False, WHY, (
        f"{WHY}: this session's pod will be evicted, and the session is not checkpointed (this kernel has no object "
        "storage to checkpoint to), so it cannot move without losing its variables and they go when the pod does; "
        "the cell runs there"))


def test_the_model_asked_matches_another_donor_in_any_case_as_placement_matches_it() -> None:
    asked = RunRequest(gpus=1, gpu_model="a100")
    assert drain_step("donor-1-gpu", asked, pool(HERE, node("donor-2-gpu", "donor-2")), None) == DrainStep(True, WHY)


def test_the_room_elsewhere_is_placements_own_rule_memory_included() -> None:
    # GPUs free but not the pod's memory: placement would not put the session there, so it stays
    short = replace(node("donor-2-gpu", "donor-2"), memory_free=4 * 2**30)
    step = drain_step("donor-1-gpu", SESSION, pool(HERE, short), None, memory="8Gi")
    assert step is not None and not step.move and "no other donor has room for this session" in step.text
    assert drain_step("donor-1-gpu", SESSION, pool(HERE, short), None, memory="2Gi") == DrainStep(True, WHY)


def test_a_distributed_session_moves_when_any_of_its_nodes_is_cordoned_and_all_its_pods_fit_elsewhere() -> None:
    ddp = RunRequest(gpus=1, ranks=Ranks(nodes=2, procs_per_node=1))
    nodes = ("donor-1-gpu", "donor-3-gpu")  # --spread: its pods on two donors, one of them drained
    there = node("donor-3-gpu", "donor-3", free=3)
    assert drain_step(nodes, ddp, pool(HERE, there, node("donor-2-gpu", "donor-2", free=2)), None) \
        == DrainStep(True, WHY)
    # two pods of one GPU on one cluster, and donor-2 has one GPU free: no room without --spread
    step = drain_step(nodes, ddp, pool(HERE, replace(there, in_use=4), node("donor-2-gpu", "donor-2", free=1)), None)
    assert step is not None and not step.move and "(--gpus 1 --nodes 2" in step.text, step
    assert drain_step(nodes, ddp, pool(replace(HERE, cordoned=False), there), None) is None
