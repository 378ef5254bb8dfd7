"""Where fractions of GPUs land: FGD keeps room for the requests that come, best-fit and most-free do not."""

from __future__ import annotations

from gpu_offload.liqo_peering.packing import (
    BestFit,
    Choice,
    Demand,
    Fgd,
    GpuNode,
    MostFree,
    ProjectPolicy,
    choices,
    fragmentation,
    give_back,
    mix_of,
    take,
)

BIG = 10**9


def node(name: str, *free: int, model: str = "A100", cpu: int = BIG, trusted: bool = False,
         price: float | None = None) -> GpuNode:
    return GpuNode(name, "donor-1", model, tuple(free), cpu, BIG, price, trusted)


def test_fragmentation_counts_gpu_share_the_mix_cannot_use():
    n = node("a", 1000, 300)
    assert fragmentation(n, mix_of([Demand(500)])) == 300  # the 300 left on GPU 1 cannot take a half
    assert fragmentation(n, mix_of([Demand(200)])) == 0
    assert fragmentation(n, mix_of([Demand(1000, gpus=2)])) == 1300  # cannot run here at all: all of it
    assert fragmentation(n, mix_of([Demand(500), Demand(200)])) == 150  # half the mix, half the time


def test_a_request_that_cannot_run_on_a_node_for_cpu_or_model_finds_all_of_it_fragmented():
    n = node("a", 1000, 1000, model="T4", cpu=4000)
    assert fragmentation(n, mix_of([Demand(500, cpu=8000)])) == 2000
    assert fragmentation(n, mix_of([Demand(500, models=frozenset({"A100"}))])) == 2000


def test_fgd_keeps_a_gpu_usable_where_best_fit_strands_a_sliver():
    pool = [node("a", 1000, 700)]
    mix = mix_of([Demand(600)])  # most requests ask for 0.6 of a GPU
    small = Demand(200)
    assert BestFit().choose(pool, small) == Choice("a", (1,))  # 700 -> 500: too little for the next 0.6
    assert Fgd(mix).choose(pool, small) == Choice("a", (0,))   # 1000 -> 800: both GPUs still take a 0.6


def test_fgd_chooses_among_nodes_by_the_fragmentation_it_adds():
    pool = [node("a", 1000, 1000), node("b", 400)]
    # b's 400 is a fragment to a mix of halves; filling it removes that fragment, while a stays usable
    assert Fgd(mix_of([Demand(500)])).choose(pool, Demand(400)) == Choice("b", (0,))
    assert MostFree().choose(pool, Demand(400)) == Choice("a", (0,))


def test_whole_gpus_need_idle_gpus_on_one_node():
    pool = [node("a", 1000, 500, 1000), node("b", 1000)]
    two = Demand(1000, gpus=2)
    assert choices(pool[0], two) == [Choice("a", (0, 2))]
    assert choices(pool[1], two) == []
    for policy in (BestFit(), MostFree(), Fgd(mix_of([two]))):
        assert policy.choose(pool, two) == Choice("a", (0, 2))
    assert BestFit().choose([node("c", 1000, 500)], Demand(1000, gpus=2)) is None


def test_take_and_give_back_keep_the_books_and_refuse_overcommit():
    n = node("a", 1000, 1000)
    after = take(n, Choice("a", (1,)), Demand(300, cpu=1000))
    assert after.free == (1000, 700)
    assert after.cpu_free == BIG - 1000
    assert give_back(after, Choice("a", (1,)), Demand(300, cpu=1000)) == n
    try:
        take(after, Choice("a", (1,)), Demand(800))
    except ValueError as e:
        assert "700 milli-GPUs free" in str(e)
    else:
        raise AssertionError("a GPU was overcommitted")


def test_the_project_policy_learns_the_mix_and_prefers_trusted_then_cheaper_donors():
    policy = ProjectPolicy(refresh=1)
    for _ in range(5):
        policy.observe(Demand(600))
    pool = [node("a", 1000, 700)]
    assert policy.choose(pool, Demand(200)) == Choice("a", (0,))  # learned that 0.6s come: as FGD did above
    same = [node("x", 1000, price=1.0), node("y", 1000, price=2.0, trusted=True), node("z", 1000, price=0.5)]
    assert policy.choose(same, Demand(500)).node == "y"
    assert policy.choose([n for n in same if not n.trusted], Demand(500)).node == "z"


def test_packing_a_mixed_stream_fgd_leaves_less_unallocated_than_best_fit():
    # Small requests first, then the big fractions that need most of a GPU: where the small ones landed
    # decides how many big ones still fit.
    stream = [Demand(300)] * 4 + [Demand(700)] * 4
    mix = mix_of(stream)
    results = {}
    for policy in (BestFit(), Fgd(mix)):
        pool = {n.name: n for n in (node("a", 1000, 1000), node("b", 1000, 1000))}
        placed = 0
        for d in stream:
            c = policy.choose(list(pool.values()), d)
            if c:
                pool[c.node] = take(pool[c.node], c, d)
                placed += d.total
        results[policy.name] = placed
    assert results["fgd"] == 4000
    assert results["best-fit"] < results["fgd"]
