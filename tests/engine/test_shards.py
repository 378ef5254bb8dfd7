"""Shares for ranks of different speeds: apportioning, the DDP loss weight, and the exchange over gloo."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_offload.engine.shards import StepTimer, apportion, loss_weight, shard_range, shard_sizes

REPO = Path(__file__).resolve().parents[2]


def test_shares_follow_speed_and_always_add_up() -> None:
    assert apportion(100, [3.0, 1.0]) == [75, 25]
    assert apportion(10, [1.0, 1.0, 1.0]) == [4, 3, 3]  # the item left goes to the lower rank on a tie
    assert apportion(7, [2.0, 1.0, 1.0]) == [3, 2, 2]  # 3.5, 1.75, 1.75: the two .75 remainders win
    for total in (0, 1, 9, 1000):
        assert sum(apportion(total, [5.0, 0.3, 2.2, 1.0])) == total
    assert shard_range([75, 25], 0) == (0, 75) and shard_range([75, 25], 1) == (75, 100)


@pytest.mark.parametrize("call, text", [
    (lambda: apportion(-1, [1.0]), "total=-1"),
    (lambda: apportion(4, []), "no ranks to share among"),
    (lambda: apportion(4, [1.0, 0.0]), "positive finite"),
    (lambda: apportion(4, [1.0, float("nan")]), "positive finite"),
    (lambda: shard_range([1, 2], 2), "rank 2: there are 2 ranks"),
    (lambda: loss_weight([0, 0], 0), "no items"),
    (lambda: shard_sizes(4, -1.0), "seconds_per_item=-1.0"),
])
def test_bad_input_names_the_problem(call, text) -> None:
    with pytest.raises(ValueError, match=text):
        call()


def test_exchange_without_a_process_group_says_what_to_call() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        shard_sizes(10, 0.5)


def test_weighted_losses_averaged_as_ddp_does_give_the_full_batch_gradient() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(12, 3), torch.randn(12, 1)
    sizes = apportion(12, [3.0, 1.0])  # [9, 3]
    model = torch.nn.Linear(3, 1)

    def grad(xs: torch.Tensor, ys: torch.Tensor, weight: float = 1.0) -> torch.Tensor:
        model.zero_grad()
        (torch.nn.functional.mse_loss(model(xs), ys) * weight).backward()
        return model.weight.grad.clone()

    full = grad(x, y)
    per_rank = [grad(x[a:b], y[a:b], loss_weight(sizes, r)) for r, (a, b) in
                enumerate(shard_range(sizes, r) for r in range(2))]
    assert torch.allclose(sum(per_rank) / 2, full, atol=1e-6)  # DDP: sum over ranks / world size
    unweighted = [grad(x[a:b], y[a:b]) for a, b in (shard_range(sizes, r) for r in range(2))]
    assert not torch.allclose(sum(unweighted) / 2, full, atol=1e-3)


def test_step_timer_counts_time_per_item() -> None:
    timer = StepTimer()
    assert timer.seconds_per_item is None
    timer.add(3.0, 6)
    with timer.timing(4):
        pass
    assert timer.items == 10 and timer.seconds >= 3.0
    timer.reset()
    assert timer.seconds_per_item is None


RANK = """import os, sys
from gpu_offload.engine.shards import shard_sizes
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
measured = {"0": 0.01, "1": 0.03, "none": None}[sys.argv[rank + 1]]
print(shard_sizes(1000, measured), shard_sizes(1000, None if rank == 0 else measured), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e  # starts a process
def test_ranks_agree_on_shares_from_their_own_measures_over_gloo(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), "0", "1"], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # rank 1 takes three times as long per item: a quarter of the items; one rank without a measure: equal
    assert [o.strip() for o, _ in outs] == ["[750, 250] [500, 500]"] * 2
