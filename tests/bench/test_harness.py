"""bench/harness.py, bench/compare.py and bench/report.py: the percentile, the JSON a run writes, RESULTS.md made
from it, and a regression flagged only beyond the run-to-run noise measured from the runs compared."""

from __future__ import annotations

import ast
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


def test_a_run_is_compared_with_the_previous_result_and_results_md_shows_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _run(tmp_path, "01", {"cell": [1.0, 1.0, 1.0], "gone": [5.0]})
    assert "previous" not in json.loads(first.read_text())  # nothing to compare the first run with
    second = _run(tmp_path, "02", {"cell": [3.0, 3.0, 3.0], "new": [1.0]})
    previous = json.loads(second.read_text())["previous"]
    assert previous["file"] == first.name and previous["revision"] == "abc1234"
    lines = previous["comparison"]
    assert lines[0].startswith("OLD and NEW have one run")
    assert any(line.startswith("REGRESSION") and "cell: 1 -> 3 ms (+200.0%" in line for line in lines)
    assert {line for line in lines if line.startswith("only in")} == {"only in    old: gone", "only in    new: new"}
    assert f"against the previous result, {first.name} (at abc1234, load" in capsys.readouterr().out
    page = report.render(tmp_path)
    assert f"Against the previous result ({first.name}, at abc1234, load" in page
    assert next(line for line in lines if "cell:" in line) in page


def test_a_figure_of_many_samples_keeps_their_quantiles_and_reports_the_count_measured(tmp_path: Path) -> None:
    values = [float(i % 997) for i in range(20_000)]
    written = _run(tmp_path, "02", {"replay": values})
    figure = json.loads(written.read_text())["figures"][0]
    assert len(figure["samples"]) == harness.KEPT_SAMPLES and figure["measured"] == 20_000
    assert figure["summary"]["n"] == 20_000
    for q in (0.5, 0.95, 0.99):
        assert harness.percentile(figure["samples"], q) == pytest.approx(harness.percentile(values, q), rel=0.01)
    assert "| replay | ms | 20000 |" in report.render(tmp_path)


def _result(folder: Path, stamp: str, figures: dict[str, list[float]], higher_better: tuple[str, ...] = (),
            load: float = 2.0, load_end: float | None = None) -> None:
    """A result file as bench/harness.py writes it, written literally (no harness code involved)."""
    data = {"benchmark": "demo", "script": "bench/bench_demo.py", "title": "Demo",
            "started": f"2026-11-27T10:00:{stamp}+00:00", "revision": "abc1234",
            "machine": {"cpu": "test cpu", "cores": 2, "memory_gib": 24, "system": "Linux", "python": "3.11.7",
                        "load": [load, load, load],
                        **({"load_end": [load_end] * 3} if load_end is not None else {})},
            "notes": [],
            "figures": [{"name": name, "unit": "ms", "samples": samples, "lower_is_better": name not in higher_better,
                         "summary": {}} for name, samples in figures.items()]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"2026-11-27T1000{stamp}+0000.json").write_text(json.dumps(data))


def _verdicts(old: Path, new: Path) -> dict[str, str]:
    return {line[10:].split(":")[0].strip(): line  # after the verdict's 10 columns
            for line in compare.compare(compare.load(old), compare.load(new))}


def test_compare_flags_only_what_moved_beyond_the_noise_of_the_runs(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    # two runs a side: the medians of "steady" differ by 10% (noise ±4.8%), of "rate" (higher is better) by 0
    _result(old, "01", {"steady": [10, 10, 10], "rate": [100, 100, 100], "moved": [10, 10, 10]}, ("rate",))
    _result(old, "02", {"steady": [11, 11, 11], "rate": [100, 100, 100], "moved": [10, 10, 10]}, ("rate",))
    _result(new, "03", {"steady": [11.2, 11.2, 11.2], "rate": [80, 80, 80], "moved": [13, 13, 13]}, ("rate",))
    _result(new, "04", {"steady": [11.2, 11.2, 11.2], "rate": [80, 80, 80], "moved": [13, 13, 13]}, ("rate",))
    lines = _verdicts(old, new)
    assert lines["steady"].startswith("ok ")  # +6.7% is within twice the ±4.8% the old runs show
    assert lines["rate"].startswith("REGRESSION")  # fewer per second is worse
    assert lines["moved"].startswith("REGRESSION")  # +30% against no measured noise
    assert "assumed" not in "".join(lines.values())
    assert compare.caveat(compare.load(old), compare.load(new)) is None
    assert compare.main([str(old), str(new)]) == 1
    assert compare.main([str(old), str(old)]) == 0


def test_one_run_a_side_says_the_noise_is_not_measured_and_flags_only_a_gross_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    # the false positive this replaces: two back-to-back runs of one revision, render_table +51% with tight
    # samples within each run (its spread within the run is ±2%, far below what changes between runs)
    _result(old, "01", {"render_table": [20.0, 20.4, 19.6, 20.2, 19.8], "doubled": [10, 10, 10],
                        "rate": [100, 100, 100]}, ("rate",))
    _result(new, "02", {"render_table": [30.2, 30.6, 29.8, 30.4, 30.0], "doubled": [21, 21, 21],
                        "rate": [45, 45, 45]}, ("rate",))
    lines = _verdicts(old, new)
    assert lines["render_table"].startswith("ok ") and "assumed: one run" in lines["render_table"]
    assert f"±{compare.SINGLE_RUN_NOISE:.1%}" in lines["render_table"]
    assert lines["doubled"].startswith("REGRESSION")  # +110%: beyond twice the assumed ±50%
    assert lines["rate"].startswith("REGRESSION")  # a rate down to 0.45x: worse by a factor of 2.2
    assert compare.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "OLD and NEW have one run: run-to-run noise not measured" in out


def test_one_run_a_side_is_judged_by_its_own_spread_when_that_is_wider(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    # old samples: quartiles 4 and 16 around a median of 10, a spread of ±60% within the run (wider than the
    # assumed ±50%): +110% is within twice that
    _result(old, "01", {"jumpy": [2, 4, 10, 16, 18]})
    _result(new, "02", {"jumpy": [4, 8, 21, 32, 36]})
    line = _verdicts(old, new)["jumpy"]
    assert line.startswith("ok ") and "noise ±60.0%" in line


def test_one_run_on_one_side_only_is_named_and_the_other_sides_noise_still_counts(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    _result(old, "01", {"cell": [10, 10, 10]})
    _result(old, "02", {"cell": [10, 10, 10]})
    _result(new, "03", {"cell": [14, 14, 14]})  # +40%: beyond the old runs' 0 noise, within the assumed ±50%
    assert _verdicts(old, new)["cell"].startswith("ok ")
    note = compare.caveat(compare.load(old), compare.load(new))
    assert note is not None and note.startswith("NEW has one run")


def test_runs_at_loads_far_apart_are_not_judged_and_the_report_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    # the comparison this replaces: every figure of a run at load 24 flagged against one at load 2.8 (2 cores)
    _result(old, "01", {"cell": [10, 10, 10]}, load=2.8)
    _result(new, "02", {"cell": [25, 25, 25]}, load=24.0)
    assert _verdicts(old, new)["cell"].startswith("not judged ")
    assert compare.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "OLD ran at load 2.8 and NEW at load 24 on 2 cores" in out and "No figure is judged" in out
    # a load that rose during the run counts: it started quiet and ended busy
    _result(tmp_path / "rose", "03", {"cell": [25, 25, 25]}, load=2.8, load_end=20.0)
    assert _verdicts(old, tmp_path / "rose")["cell"].startswith("not judged ")


def test_runs_at_similar_loads_are_judged_and_an_idle_core_counts_as_no_load(tmp_path: Path) -> None:
    old, new, quiet = tmp_path / "old", tmp_path / "new", tmp_path / "quiet"
    _result(old, "01", {"cell": [10, 10, 10]}, load=5.0)
    _result(new, "02", {"cell": [25, 25, 25]}, load=7.0)  # 2.5 and 3.5 per core: comparable
    assert _verdicts(old, new)["cell"].startswith("REGRESSION")
    assert compare.caveat(compare.load(old), compare.load(new)).startswith("OLD and NEW have one run")
    _result(quiet, "03", {"cell": [10, 10, 10]}, load=0.2)  # a core idle on both sides: 1 per core each
    _result(tmp_path / "busier", "04", {"cell": [25, 25, 25]}, load=1.9)
    assert _verdicts(quiet, tmp_path / "busier")["cell"].startswith("REGRESSION")


def test_a_run_written_records_the_load_at_its_end(tmp_path: Path) -> None:
    written = _run(tmp_path, "01", {"cell": [1.0]})
    machine = json.loads(written.read_text())["machine"]
    assert len(machine["load_end"]) == 3 and machine["load"] != [] and compare.run_load({"machine": machine}) >= 0


OWN_CLOCKS = {"perf_counter", "perf_counter_ns", "process_time", "thread_time"}


def test_every_benchmark_writes_its_result_through_the_harness_and_times_with_its_clocks() -> None:
    scripts = sorted(BENCH.glob("bench_*.py"))
    assert len(scripts) > 20
    for module in sorted(BENCH.glob("*.py")):
        if module.name in {"harness.py", "figure.py"}:  # the harness itself (figure.py: its samples and quantiles)
            continue
        tree = ast.parse(module.read_text())
        clocks = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in OWN_CLOCKS
                         and isinstance(n.value, ast.Name) and n.value.id == "time"})
        assert not clocks, f"{module.name} times with time.{clocks[0]}: use harness.Stopwatch, timed or clock"
        helpers = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                   and ("percentile" in n.name or "quantile" in n.name or n.name in {"timed", "_ms"})]
        assert not helpers, f"{module.name} keeps its own {helpers[0]}: use harness.percentile / harness.timed"
        if module in scripts:
            calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
            assert any(isinstance(f, ast.Name) and f.id == "Run" for f in calls), f"{module.name} builds no Run"
            assert any(isinstance(f, ast.Attribute) and f.attr == "write" for f in calls), \
                f"{module.name} writes no result (Run.write)"


def test_results_md_is_generated_from_the_results_kept() -> None:
    assert report.render() == (BENCH / "RESULTS.md").read_text(), \
        "bench/RESULTS.md is not what bench/results/ makes: run `.venv/bin/python bench/report.py` and commit it"
