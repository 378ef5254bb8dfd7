"""Distributed cells (``--nodes``) on the local backend, with the real runner and torch's gloo on CPU:
DDP across 2 nodes x 2 processes, every rank's output, a failing rank, the torchrun environment."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output

from gpu_offload.engine.errors import RemoteError

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane
torch = pytest.importorskip("torch")

TWO_BY_TWO = "--nodes 2 --procs-per-node 2 --gpus 0"

DDP_CELL = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.Linear(4, 1)
model.load_state_dict(initial)
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
xs, ys = X[rank::world], Y[rank::world]
for step in range(STEPS):
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(xs), ys).backward()
    opt.step()
weights = {name: value.detach().clone() for name, value in model.state_dict().items()}
print(f"rank {rank} of {world} trained", flush=True)
del ddp, opt
dist.destroy_process_group()
"""



def notices(captured: Any) -> str:
    """The magic's notices: its one display output per cell (plain text), not the cell's own output."""
    return "\n".join(str(o.data.get("text/plain", "")) for o in captured.outputs)

def offload(shell: Any, cell: str, line: str) -> Any:
    return shell.run_cell_magic("gpu_offload", line, cell)


def trained_in_one_process(initial: Any, X: Any, Y: Any, steps: int, lr: float) -> Any:
    """The state dict of a Linear(4, 1) trained from ``initial`` by full-batch SGD on all of X, Y."""
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(initial)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
    return model.state_dict()


def test_ddp_on_two_nodes_of_two_ranks_equals_training_in_one_process(shell: Any) -> None:
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=generator)
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=generator)
    initial = torch.nn.Linear(4, 1).state_dict()
    shell.user_ns.update(X=X, Y=Y, initial=initial, STEPS=20)

    with capture_output() as captured:
        offload(shell, DDP_CELL, TWO_BY_TWO)

    # the same steps on all the data in one process: DDP averages the ranks' gradients of equal shards
    weights = shell.user_ns["weights"]
    for name, value in trained_in_one_process(initial, X, Y, steps=20, lr=0.1).items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
    assert not torch.equal(weights["weight"], initial["weight"])  # it did train
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} of 4 trained" in captured.stdout
    assert shell.user_ns["rank"] == 0  # variables come from rank 0


def test_ranks_get_torchruns_environment_and_variables_come_from_the_out_rank(shell: Any) -> None:
    cell = (
        "import os\nnames = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'MASTER_ADDR',"
        " 'MASTER_PORT', 'OMP_NUM_THREADS']\nenv = {name: os.environ[name] for name in names}\n"
        "print(' '.join(f'{k}={v}' for k, v in env.items()))"
    )
    with capture_output() as captured:
        offload(shell, cell, TWO_BY_TWO + " --out-rank 3")
    env = shell.user_ns["env"]
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"].isdigit() and env["OMP_NUM_THREADS"] == "1"
    for rank in range(4):
        assert f"[rank {rank}] RANK={rank} LOCAL_RANK={rank % 2} WORLD_SIZE=4" in captured.stdout


def test_a_rank_that_raises_ends_the_run_with_its_traceback_while_the_others_wait_in_a_collective(
    shell: Any,
) -> None:
    shell.user_ns["kept"] = "before"
    cell = (
        "import torch.distributed as dist\ndist.init_process_group('gloo')\nkept = 'after'\n"
        "print('reached the barrier', flush=True)\n"
        "if dist.get_rank() == 2:\n    raise ValueError('rank two gives up')\ndist.barrier()\n"
    )
    with capture_output() as captured, pytest.raises(RemoteError) as caught:
        offload(shell, cell, TWO_BY_TWO)
    assert caught.value.ename == "ValueError" and "[rank 2]" in caught.value.evalue
    rendered = "\n".join(caught.value._render_traceback_())
    assert "rank 2 of 4 (node 1) failed" in rendered and "raise ValueError('rank two gives up')" in rendered
    assert "[rank 2] reached the barrier" in captured.stdout
    assert shell.user_ns["kept"] == "before"  # no variable copied back
    # no launcher or rank process is left: the autouse fixture no_runner_left_behind checks it


def test_quiet_ranks_shows_rank_0_only_and_group_output_shows_each_rank_together(shell: Any) -> None:
    cell = "import os\nprint('line one of', os.environ['RANK'])\nprint('line two of', os.environ['RANK'])"
    with capture_output() as quiet:
        offload(shell, cell, TWO_BY_TWO + " --quiet-ranks")
    assert quiet.stdout.splitlines() == ["line one of 0", "line two of 0"]
    with capture_output() as grouped:
        offload(shell, cell, TWO_BY_TWO + " --group-output")
    assert grouped.stdout.splitlines() == [
        line for rank in range(4) for line in (f"[rank {rank}]", f"line one of {rank}", f"line two of {rank}")]


def test_every_rank_reads_the_same_inputs_and_one_ranks_in_place_change_stays_its_own(shell: Any) -> None:
    np = pytest.importorskip("numpy")
    shell.user_ns["a"] = np.ones(100_000)  # large enough to travel through shared memory
    cell = (
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "if dist.get_rank() == 0:\n    a *= 2\ndist.barrier()\nprint('sum', float(a.sum()), flush=True)\n"
        "dist.destroy_process_group()"
    )
    with capture_output() as captured:
        offload(shell, cell, "--procs-per-node 2 --gpus 0")
    assert "[rank 0] sum 200000.0" in captured.stdout
    assert "[rank 1] sum 100000.0" in captured.stdout
    assert float(shell.user_ns["a"].sum()) == 200000.0  # the notebook gets rank 0's


def test_a_distributed_session_keeps_every_ranks_state_across_three_cells(shell: Any) -> None:
    generator = torch.Generator().manual_seed(1)
    X = torch.randn(32, 4, generator=generator)
    Y = X.sum(dim=1, keepdim=True)
    initial = torch.nn.Linear(4, 1).state_dict()
    shell.user_ns.update(X=X, Y=Y, initial=initial)
    line = TWO_BY_TWO + " --session ddp"
    # the process group and the DDP module live on in every rank; each cell asks its rank anew, since a
    # notebook variable a cell reads (rank 0's `rank`, once it came back) goes to every rank as an input
    build = (
        "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n"
        "dist.init_process_group('gloo')\nlinear = torch.nn.Linear(4, 1)\nlinear.load_state_dict(initial)\n"
        "ddp = DistributedDataParallel(linear)\n"
    )
    train = (
        "rank, world = dist.get_rank(), dist.get_world_size()\n"
        "opt = torch.optim.SGD(ddp.parameters(), lr=0.05)\nfor _ in range(10):\n    opt.zero_grad()\n"
        "    torch.nn.functional.mse_loss(ddp(X[rank::world]), Y[rank::world]).backward()\n    opt.step()\n"
        "print('trained', flush=True)"
    )
    finish = (
        "weights = {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}\n"
        "ranks_sum = torch.tensor([float(dist.get_rank())])\ndist.all_reduce(ranks_sum)\n"
        "dist.destroy_process_group()\n"
    )
    with capture_output() as built:
        offload(shell, build, line)
    # a DDP module cannot exist outside its process group: it stays on the ranks, and the user is told why
    assert "output `ddp` (DistributedDataParallel) is bound to the run's process group" in notices(built)
    assert "ddp" not in shell.user_ns and isinstance(shell.user_ns["linear"], torch.nn.Linear)
    with capture_output() as trained:
        offload(shell, train, line)
    offload(shell, finish, line)
    assert shell.run_line_magic("gpu_offload", "close ddp") is None

    for name, value in trained_in_one_process(initial, X, Y, steps=10, lr=0.05).items():
        torch.testing.assert_close(shell.user_ns["weights"][name], value, rtol=1e-5, atol=1e-6)
    assert float(shell.user_ns["ranks_sum"]) == 6.0  # 0 + 1 + 2 + 3: all four ranks kept their group
    for rank in range(4):
        assert f"[rank {rank}] trained" in trained.stdout


# Rank 1 gives up only once the other three are in the barrier: an interrupt reaching a rank still in Python
# stops it at once, and the case is about ranks stuck in a collective's wait (slow starts under load had rank 1
# fail first, the others were interrupted before the barrier and no "did not stop" came).
GIVE_UP_IN_BARRIER = """\
import pathlib, time
marks = pathlib.Path({marks!r})
if dist.get_rank() == 1:
    deadline = time.monotonic() + 120
    while len(list(marks.glob("in-barrier-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # from the mark to the barrier's own wait
    raise ValueError('rank one gives up')
(marks / f"in-barrier-{{dist.get_rank()}}").touch()
dist.barrier()
"""


def test_a_session_whose_ranks_wait_in_a_collective_for_a_failed_rank_is_closed_and_started_anew(
    shell: Any, tmp_path: Any,
) -> None:
    line = TWO_BY_TWO + " --session broken"
    marks = tmp_path / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)  # the ranks may run as another user
    offload(shell, "import torch.distributed as dist\ndist.init_process_group('gloo')", line)
    with capture_output() as failed, pytest.raises(RemoteError) as caught:
        offload(shell, GIVE_UP_IN_BARRIER.format(marks=str(marks)), line)
    assert caught.value.ename == "ValueError" and "[rank 1]" in caught.value.evalue
    assert "did not stop within 5 s after rank 1 failed" in notices(failed)
    with capture_output() as again:
        offload(shell, "import os\nprint('fresh', os.environ['RANK'])", line)
    assert "session `broken`'s runner had ended" in notices(again)
    assert "[rank 3] fresh 3" in again.stdout
    shell.run_line_magic("gpu_offload", "close broken")
