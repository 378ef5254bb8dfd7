"""Compare benchmark results: ``bench/compare.py OLD NEW``, each a JSON file bench/harness.py wrote or a folder
of them (several runs of one benchmark, e.g. ``bench/results/placement``, or a copy of some).

For each figure: the median over the runs of each side (each run's median), the change, and the run-to-run
noise measured from those runs: half the range of the run medians over their median, the larger of the two
sides. A change for the worse beyond twice the noise, and at least 5%, is flagged REGRESSION (judged as a
factor: a rate halved counts as a time doubled); the exit code is then 1.

With one run on a side the run-to-run noise cannot be measured: the spread of the samples within one run
leaves out what changes between runs (the load of the other sessions on this shared machine), and judging by
it flagged +51% on two back-to-back runs of one revision. Such a side's noise is then the larger of
``SINGLE_RUN_NOISE`` (an assumed floor, below) and the figure's own spread within the run; the report says so
on its first lines and on each figure judged that way. Run a benchmark two or three times on each side to
measure the noise instead of assuming it.

Wall times on this shared machine follow its load (the other sessions' work): a run at load 24 on 2 cores
took twice as long as one at load 3 without any change of the code. Each result records the 1-minute load
average when the run started and when it was written (``machine.load``, ``machine.load_end``); when one side
ran on a machine more than ``LOAD_APART`` times as busy as the other (load per core, counting a machine with
an idle core as 1), no figure is judged: each says ``not judged`` and the report says why, instead of
flagging a regression (or an improvement) the load made. Run both sides at a similar load."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from figure import Figure

MIN_CHANGE = 0.05
"""A change under 5% is never flagged: a figure with one sample has no measured noise."""

SINGLE_RUN_NOISE = 0.5
"""The relative run-to-run noise assumed for a side with one run, so a change must pass 2 x 50% (a figure
doubles, or halves when higher is better) to be flagged. Why so wide: wall times kept in bench/results moved
by up to half their middle between runs of this shared 2-core machine (runner start, three runs at loads
3-20: +-47%; the panel's render_table +-41%), while CPU times moved by at most 15%. One run per side can only
catch a gross regression; measure the noise with more runs to catch a small one."""


LOAD_APART = 2.0
"""How many times busier (load per core, at least 1) one side's machine may have been than the other's for
their figures to be compared: wall times kept in bench/results grew about as fast as the load per core
(warm cell: 0.5 ms at load 3, 2.2 ms at load 16, on 2 cores)."""


def run_load(run: dict[str, Any]) -> float:
    """A run's 1-minute load average: the higher of its start and its end (older results: the start)."""
    machine = run["machine"]
    return max(machine["load"][0], machine.get("load_end", machine["load"])[0])


def busy(run: dict[str, Any]) -> float:
    """How busy the machine was during the run: load per core, 1 while a core was idle."""
    return max(1.0, run_load(run) / max(1, machine_cores(run)))


def machine_cores(run: dict[str, Any]) -> int:
    return int(run["machine"].get("cores") or 1)


def load_gap(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str | None:
    """Why the two sides cannot be compared for their loads (``None``: close enough). Each side's busyness
    is the median over its runs."""
    was = statistics.median(busy(run) for run in old)
    now = statistics.median(busy(run) for run in new)
    if max(was, now) / min(was, now) <= LOAD_APART:
        return None
    loads = {label: ", ".join(f"{run_load(run):g}" for run in runs) for label, runs in (("OLD", old), ("NEW", new))}
    return (f"OLD ran at load {loads['OLD']} and NEW at load {loads['NEW']} on {machine_cores(old[0])} cores: one "
            f"machine was {max(was, now) / min(was, now):.1f}x as busy as the other (more than {LOAD_APART:g}x), "
            "so their times say more about the load than about the code. No figure is judged; run both sides at "
            "a similar load to compare them.")


@dataclass(frozen=True)
class Side:
    """One side's measurement of a figure: the median over its runs and its relative noise."""

    median: float
    noise: float
    measured: bool
    """Whether the noise was measured between runs (two or more) or assumed (one run)."""


@dataclass(frozen=True)
class Verdict:
    before: float
    after: float
    change: float
    noise: float
    measured: bool
    regressed: bool


def load(path: Path) -> list[dict[str, Any]]:
    """The runs in a result file or a folder of them, oldest first."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise SystemExit(f"{path}: no result files in it; run the benchmark first")
    runs = [json.loads(f.read_text()) for f in files]
    if len({run["benchmark"] for run in runs}) > 1:
        raise SystemExit(f"{path}: results of several benchmarks; give one benchmark's folder or file")
    return runs


def figures(runs: list[dict[str, Any]]) -> dict[str, list[Figure]]:
    """Each figure's name and its measurement in every run that has it."""
    found: dict[str, list[Figure]] = {}
    for run in runs:
        for f in run["figures"]:
            found.setdefault(f["name"], []).append(
                Figure(f["name"], f["unit"], tuple(f["samples"]), f["lower_is_better"], f.get("measured", 0)))
    return found


def side(measured: list[Figure]) -> Side:
    """The median over runs and the run-to-run noise (relative) of one side."""
    medians = [f.median for f in measured]
    middle = statistics.median(medians)
    if len(medians) == 1:
        return Side(middle, max(SINGLE_RUN_NOISE, measured[0].noise()), measured=False)
    return Side(middle, (max(medians) - min(medians)) / 2 / abs(middle) if middle else 0.0, measured=True)


def verdict(old: list[Figure], new: list[Figure]) -> Verdict:
    """Old and new medians, the relative change, the noise it is judged against, and whether it regressed."""
    was, now = side(old), side(new)
    change = (now.median - was.median) / abs(was.median) if was.median else 0.0
    noise = max(was.noise, now.noise)
    # judged as a factor, so that halving a rate counts as much as doubling a time
    if old[0].lower_is_better:
        factor = now.median / was.median if was.median > 0 else 1.0
    else:
        factor = was.median / now.median if now.median > 0 else (1.0 if was.median <= 0 else float("inf"))
    return Verdict(was.median, now.median, change, noise, was.measured and now.measured,
                   factor - 1 > max(2 * noise, MIN_CHANGE))


def compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """One line per figure measured on both sides, ``REGRESSION`` where it regressed, ``not judged`` for every
    figure when the sides' loads were too far apart (:func:`load_gap`)."""
    before, after = figures(old), figures(new)
    apart = load_gap(old, new) is not None
    lines = []
    for name in [n for n in before if n in after]:
        v = verdict(before[name], after[name])
        how = "" if v.measured else " assumed: one run"
        word = "not judged" if apart else "REGRESSION" if v.regressed else "ok"
        lines.append(f"{word:10} {name}: {v.before:.4g} -> {v.after:.4g} "
                     f"{before[name][0].unit} ({v.change:+.1%}, noise ±{v.noise:.1%}{how})")
    for name in sorted(set(before) ^ set(after)):
        lines.append(f"{'only in':10} {'old' if name in before else 'new'}: {name}")
    return lines


def caveat(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str | None:
    """What the reader must know: the sides' loads too far apart to judge (:func:`load_gap`), or a side with
    one run, whose noise is assumed, not measured."""
    gap = load_gap(old, new)
    if gap is not None:
        return gap
    single = [label for label, runs in (("OLD", old), ("NEW", new)) if len(runs) == 1]
    if not single:
        return None
    return (f"{' and '.join(single)} {'has' if len(single) == 1 else 'have'} one run: run-to-run noise not measured; "
            f"each figure is judged against ±{SINGLE_RUN_NOISE:.0%} assumed (or its own spread within the run if "
            "larger), so only a gross change is flagged. Run the benchmark 2-3 times per side to measure the noise.")


def describe(label: str, runs: list[dict[str, Any]]) -> str:
    revisions = sorted({run["revision"] for run in runs})
    loads = [run_load(run) for run in runs]
    return (f"{label}: {runs[0]['benchmark']}, {len(runs)} run(s) at {', '.join(revisions)}, "
            f"{runs[0]['started']} .. {runs[-1]['started']}, 1-minute load {min(loads)}-{max(loads)}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    old, new = (load(Path(a)) for a in argv)
    if old[0]["benchmark"] != new[0]["benchmark"]:
        raise SystemExit(f"OLD is {old[0]['benchmark']!r} and NEW is {new[0]['benchmark']!r}: compare one benchmark")
    print(describe("old", old))
    print(describe("new", new))
    note = caveat(old, new)
    if note:
        print(note)
    lines = compare(old, new)
    print("\n".join(lines))
    return 1 if any(line.startswith("REGRESSION") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
