"""bench/harness.py, bench/compare.py and bench/report.py: the percentile, the JSON a run writes, RESULTS.md made
from it, and a regression flagged only beyond the run-to-run noise measured from the runs compared."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
import harness  # noqa: E402
import report  # noqa: E402


def test_percentile_interpolates_between_ranks_and_has_none_for_no_values() -> None:
    assert harness.percentile([5, 1, 3, 2, 4], 0.5) == 3
    assert harness.percentile([1, 2, 3, 4, 5], 0.95) == pytest.approx(4.8)
    assert harness.percentile([7], 0.99) == 7
    assert math.isnan(harness.percentile([], 0.5))


def _run(folder: Path, stamp: str, samples: dict[str, list[float]], higher_better: tuple[str, ...] = ()) -> Path:
    run = harness.Run("demo", "Demo", started=f"2026-11-27T10:00:{stamp}+00:00", revision="abc1234")
    for name, values in samples.items():
        run.figure(name, values, "ms", lower_is_better=name not in higher_better)
    return run.write(folder)


def test_a_run_writes_json_that_results_md_shows(tmp_path: Path) -> None:
    written = _run(tmp_path, "01", {"cell": [1.0, 2.0, 3.0]})
    data = json.loads(written.read_text())
    assert written.parent.name == "demo" and data["benchmark"] == "demo"
    assert data["figures"][0]["samples"] == [1.0, 2.0, 3.0] and data["figures"][0]["summary"]["median"] == 2.0
    assert data["machine"]["cores"] and data["revision"] == "abc1234"
    page = report.render(tmp_path)
    assert "## Demo (bench/bench_demo.py)" in page and "| cell | ms | 3 | 2 |" in page


def test_compare_flags_only_what_moved_beyond_the_noise_of_the_runs(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    # two old runs: the medians of "steady" differ by 10% (noise ±4.8%), of "rate" (higher is better) by 0
    _run(old, "01", {"steady": [10, 10, 10], "rate": [100, 100, 100], "moved": [10, 10, 10]}, ("rate",))
    _run(old, "02", {"steady": [11, 11, 11], "rate": [100, 100, 100], "moved": [10, 10, 10]}, ("rate",))
    _run(new, "03", {"steady": [11.2, 11.2, 11.2], "rate": [80, 80, 80], "moved": [13, 13, 13]}, ("rate",))
    old, new = old / "demo", new / "demo"  # a run writes FOLDER/<benchmark>/<start time>.json
    lines = {line.split(":")[0].split(maxsplit=1)[1]: line for line in compare.compare(compare.load(old),
                                                                                         compare.load(new))}
    assert lines["steady"].startswith("ok ")  # +6.7% is within twice the ±4.8% the old runs show
    assert lines["rate"].startswith("REGRESSION")  # fewer per second is worse
    assert lines["moved"].startswith("REGRESSION")
    assert compare.main([str(old), str(new)]) == 1
    assert compare.main([str(old), str(old)]) == 0
