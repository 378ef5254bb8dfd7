"""bench/bench_sessions_replay.py: the trace replay of sessions drives the product's decisions and keeps its books.
Its invariants, not its figures: no GPU booked twice, the pool empty at the end, every cell of every session run
(or the session given up), every GPU second a session held booked once, and what the product promises with object
storage (no finished cell's results lost) against a revision without checkpoints (nothing resumed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import alibaba_trace  # noqa: E402
import bench_sessions_replay  # noqa: E402
from session_flow import Sessions  # noqa: E402
from session_pool import Trace  # noqa: E402
from session_rules import Rules  # noqa: E402

needs_trace = pytest.mark.skipif(alibaba_trace.missing() is not None, reason=str(alibaba_trace.missing()))


@needs_trace
def test_three_busy_days_keep_the_books_and_lose_no_finished_cell_with_checkpoints() -> None:
    result = bench_sessions_replay.replay(3.0, 0.9, check=True)  # raises on a broken invariant
    t, ledger = result["tally"], result["ledger"]
    assert result["absent"] == []  # every decision came from this tree's own code
    assert result["sessions"] > 50 and t["releases"] > 0 and t["returned"] > 0
    assert t["sessions_preempted"] > 0 and sum(t["resumed"].values()) > 0
    assert t["lost"] == {"preemption": 0.0, "idle release": 0.0} and ledger["redone"] == 0.0
    assert ledger["held"] == pytest.approx(ledger["ran"] + ledger["restore"] + ledger["idle"])
    assert ledger["ran"] == pytest.approx(ledger["done"] + ledger["partial lost"])
    assert t["shots_done"] + t["shots_failed"] == result["shots"]
    assert len(t["light_waits"]) == t["light_cells"]  # one wait per light user's cell that ran


def test_a_gpu_booked_twice_stops_the_replay() -> None:
    pool = Sessions(1, Rules(), check=True)
    pool.at(0.0, pool.on_trace_arrive, Trace(0, 10.0, "batch"), 1)
    pool.run()
    pod = pool.create(20.0, Trace(1, 10.0, "batch"), 1, "batch")
    pool.free = 0  # a GPU the books say is held
    with pytest.raises(AssertionError, match="double-booked"):
        pool._admit(pod, 20.0)


@pytest.mark.e2e
@needs_trace
def test_quick_replays_this_tree_and_the_pinned_revision_side_by_side(tmp_path: Path) -> None:
    repo = BENCH.parent
    pinned = bench_sessions_replay.PINNED
    if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{pinned}^{{commit}}"]).returncode != 0:
        pytest.skip(f"this clone lacks revision {pinned} (a shallow clone)")
    before = _worktrees(repo)
    assert bench_sessions_replay.main(["--quick", "--results", str(tmp_path)]) == 0
    (written,) = (tmp_path / "sessions_replay_quick").glob("*.json")
    data = json.loads(written.read_text())
    figures = {f["name"]: f["samples"] for f in data["figures"]}
    pool = next(n for n in data["notes"] if n.startswith("replay:")).split("a pool of ")[1].split(" ")[0]
    this, old = f"pool {pool} GPUs, this tree", f"pool {pool} GPUs, pinned {pinned}"
    assert any(n.startswith(f"{old}: not in its code: ") and "checkpoints" in n for n in data["notes"])
    assert figures[f"{this}: finished cells' work lost after idle release"] == [0.0]
    assert figures[f"{old}: finished cells' work resumed after idle release"] == [0.0]
    assert figures[f"{old}: finished cells' work lost after idle release"][0] > 0
    assert f"{this}: start estimate abs error / actual wait, at arrival" in figures
    assert not any(name.startswith(old) and "start estimate" in name for name in figures)  # it had none
    assert _worktrees(repo) <= before  # the temporary worktree of the pinned revision is gone


def _worktrees(repo: Path) -> set[str]:
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout
    return {line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")}
