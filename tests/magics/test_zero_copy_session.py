"""Through the magic and a real local runner: arrays that came back from a cell go out again without a copy,
the runner cannot change the notebook's copy, and nothing stays in /dev/shm once the variables are gone."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

from gpu_offload.runner import lending

pytestmark = pytest.mark.e2e  # starts a runner process


def mapped_inode(array: np.ndarray) -> int | None:
    """The inode of the file mapped where ``array``'s memory is, from /proc/self/maps (None: not a file)."""
    address = array.__array_interface__["data"][0]
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high:
            return int(fields[4]) or None
    return None


def held_here() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"gpuo-held-{os.getpid()}-")]


def test_arrays_travel_between_cells_without_copies_and_leave_nothing(shell) -> None:
    shell.run_cell_magic("gpu_offload", "--session zc", "import numpy as np\na = np.arange(2_000_000.0)")
    inode = mapped_inode(shell.user_ns["a"])
    assert inode is not None and len(held_here()) == 1  # held in shared memory while `a` lives

    shell.run_cell_magic("gpu_offload", "--session zc", "b = a")
    assert mapped_inode(shell.user_ns["b"]) == inode  # out and back by name: the same pages
    assert len(held_here()) == 2  # one name per variable

    # the runner writes to what it was lent: the notebook's `a` does not change
    shell.run_cell_magic("gpu_offload", "--session zc", "a[0] = 99.0\ntotal = float(a.sum())")
    assert shell.user_ns["a"][0] == 0.0
    assert shell.user_ns["total"] == float(np.arange(2_000_000.0).sum()) + 99.0

    # the notebook writes to its `a`: the next cell sees the change (it was copied, not lent)
    shell.user_ns["a"][1] = -5.0
    shell.run_cell_magic("gpu_offload", "--session zc", "second = float(a[1])")
    assert shell.user_ns["second"] == -5.0

    for _ in range(20):
        shell.run_cell_magic("gpu_offload", "--session zc", "b = b + 1")
    assert shell.user_ns["b"][0] == 20.0
    assert len(held_here()) <= 3

    shell.run_line_magic("gpu_offload", "close zc")
    for name in ("a", "b"):
        shell.user_ns.pop(name, None)
    shell.reset()
    gc.collect()
    assert held_here() == [] and lending.held_files() == []
