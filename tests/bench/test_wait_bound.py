"""bench/wait_bound.py: the pieces that make bench_wait_bound.py's figures, on literal lines and waits: the oracle's
replay of the line forward, the best single value within 30 %, the per-class bound, the online model's use of the
past only, and the ends the product knows."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import alibaba_trace  # noqa: E402
import bench_wait_bound  # noqa: E402
from wait_bound import KnownEnd, Wait, best_value, class_bound, known_start, median, online, oracle_start  # noqa: E402


def _wait(pod: int, created: float, started: float, position: int = 0) -> Wait:
    return Wait(pod, True, 1000, 1, position, created, (None, None, None), 0.0, None, started)


def test_the_oracle_replays_the_line_forward_with_smaller_runs_passing() -> None:
    # two GPUs come free at 10 and 20; the run ahead asks for 2, so a 1-GPU run behind it starts at 10 (passing)
    assert oracle_start(0.0, 0, [(10.0, 1), (20.0, 2)], [(2, 5.0)], 1) == 10.0
    # a 1-GPU run ahead takes the first free GPU and holds it 5 s: this run starts when it leaves
    assert oracle_start(0.0, 0, [(10.0, 1)], [(1, 5.0)], 1) == 15.0
    # runs ending at the same moment free their GPUs together
    assert oracle_start(0.0, 0, [(10.0, 1), (10.0, 1)], [], 2) == 10.0
    # nothing ever ends: it never starts
    assert oracle_start(0.0, 0, [], [], 1) == math.inf


def test_the_best_value_is_within_30_percent_of_the_most_waits() -> None:
    value, count = best_value([10.0, 12.0, 13.0, 100.0])
    assert count == 3 and all(abs(value - w) <= 0.3 * w for w in (10.0, 12.0, 13.0))
    assert best_value([]) == (0.0, 0)


def test_the_class_bound_fits_one_value_per_class_and_scores_held_out_halves_apart() -> None:
    waits = [_wait(i, 0.0, w, position=0 if i < 4 else 20) for i, w in enumerate((10, 11, 12, 13, 500, 520, 90, 95))]
    fitted, held, classes = class_bound(waits, lambda w: w.position)
    assert classes == 2 and len(fitted) == len(held) == 8
    assert sum(e <= 0.3 for e in fitted) == 6  # 10-13 in one class, 500/520 or 90/95 in the other
    assert median([1.0, math.inf, 0.1]) == 1.0 and median([0.1, math.inf]) == math.inf


def test_the_online_model_learns_only_from_waits_that_had_started() -> None:
    # ten waits of one class start before the eleventh is created: it is estimated from them; a twelfth created
    # before any of them started has no history and takes the kernel's estimate (none here)
    early = [_wait(i, float(i), 100.0 + i) for i in range(10)]
    late = _wait(10, 200.0, 300.0)
    blind = _wait(11, 50.0, 400.0)
    got = {m.wait.pod: m for m in online([*early, late, blind], lambda w: 0)}
    assert got[10].own and got[10].guess is not None and abs(got[10].guess - 100.0) <= 30.0
    assert got[10].low is not None and got[10].high is not None and got[10].low <= 100.0 <= got[10].high
    assert not got[11].own and got[11].guess is None


def test_known_ends_free_enough_gpus_at_the_first_end_that_covers_the_line() -> None:
    ends = [KnownEnd(300.0, 1, "idle release"), KnownEnd(100.0, 1, "protection end"), KnownEnd(200.0, 2, "idle release")]
    assert known_start(3, 0, ends) == ends[2]  # 1 GPU at 100 s, 2 more at 200 s
    assert known_start(1, 1, ends) is None  # enough free now: nothing to wait for as far as they go
    assert known_start(9, 0, ends) is None  # they never free enough


@pytest.mark.skipif(alibaba_trace.missing() is not None, reason=str(alibaba_trace.missing()))
def test_looking_at_a_moment_of_each_wait_changes_nothing_in_the_replay() -> None:
    from bench_sessions_replay import fill, load
    from session_rules import Rules
    from wait_bound import Watched

    tasks, begin, end = load(2.0)
    first = Watched(40, Rules(), None)
    fill(first, tasks, begin, end)
    first.run()
    second = Watched(40, Rules(), first)
    fill(second, tasks, begin, end)
    second.run()
    # the same pods admitted and gone at the same times, whether a moment of each wait was looked at or not
    assert second.admitted_at == first.admitted_at and second.left == first.left
    waited = {p for p, t in first.admitted_at.items() if t > first.created[p]}
    assert waited and set(second.waits) == waited and set(second.moments) <= waited
    for pod, seen in second.moments.items():
        assert second.waits[pod].created <= seen.created <= seen.started == first.admitted_at[pod]


@pytest.mark.e2e
@pytest.mark.skipif(alibaba_trace.missing() is not None, reason=str(alibaba_trace.missing()))
def test_quick_run_prints_the_three_estimates_side_by_side(tmp_path: Path) -> None:
    assert bench_wait_bound.main(["--quick", "--results", str(tmp_path)]) == 0
    (written,) = (tmp_path / "wait_bound_quick").glob("*.json")
    result = json.loads(written.read_text())
    names = [f["name"] for f in result["figures"]]
    for when in ("at arrival", "at a random moment"):
        for estimator in ("oracle", "best per class (pace), bound", "online per class", "kernel"):
            assert any(f"every pod that waited, {when}: {estimator}: median error" in n for n in names), estimator
    assert result["machine"]["load"] and result["started"]
