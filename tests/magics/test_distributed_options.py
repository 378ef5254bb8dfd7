"""The options of a distributed cell (``--nodes``): bad combinations are refused with the fix, nothing launched."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError

from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.request import OffloadRequest


def offload(shell: Any, cell: str, line: str) -> Any:
    return shell.run_cell_magic("gpu_offload", line, cell)


@pytest.mark.parametrize(("line", "message"), [
    ("--nodes 2 --gpus 0 --procs-per-node 2 --out-rank 4", r"--out-rank 4: the run has ranks 0 to 3"),
    ("--nodes 2 --out-rank -1", r"--out-rank -1: the run has ranks 0 to 1"),
    ("--nodes 0", r"--nodes 0: a distributed run needs at least one node"),
    ("--nodes 2 --gpus 2 --procs-per-node 4", r"more ranks than GPUs on a node.*--procs-per-node 2 or fewer"),
    ("--nodes 2 --procs-per-node 0 --gpus 0", r"each node runs at least one rank"),
    ("--nodes 2 --group-output --quiet-ranks", r"choose one"),
    ("--nodes 2 --rendezvous-timeout 0", r"give a positive number of seconds"),
    ("--out-rank 1", r"--out-rank: only a distributed run has ranks\. Add --nodes N"),
    ("--quiet-ranks --spread", r"--quiet-ranks, --spread: only a distributed run"),
])
def test_bad_distributed_options_are_refused_and_nothing_is_launched(
    shell: Any, backend: Any, line: str, message: str
) -> None:
    shell.user_ns["x"] = "kept"
    with pytest.raises(UsageError, match=message):
        offload(shell, "x = 'overwritten'", line)
    assert backend.submitted == []
    assert shell.user_ns["x"] == "kept"


def test_ranks_default_to_one_per_gpu_or_one_on_cpu() -> None:
    assert OffloadRequest("", gpus=4, nodes=2).ranks == Ranks(2, 4)
    assert OffloadRequest("", gpus=0, nodes=3).ranks == Ranks(3, 1)
    assert OffloadRequest("", gpus=0, procs_per_node=2).ranks == Ranks(1, 2)  # alone it means one node
    shape = OffloadRequest("", gpus=0, nodes=2, procs_per_node=2, out_rank=3, rendezvous_timeout=9).ranks
    assert shape == Ranks(2, 2, out_rank=3, rendezvous_timeout=9.0) and shape.world_size == 4
    assert OffloadRequest("", gpus=4).ranks is None  # --gpus alone keeps one runner with four GPUs


