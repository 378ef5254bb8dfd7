"""Compare benchmark results: ``bench/compare.py OLD NEW``, each a JSON file bench/harness.py wrote or a folder
of them (several runs of one benchmark, e.g. ``bench/results/placement``, or a copy of some).

For each figure: the median over the runs of each side (each run's median), the change, and the run-to-run
noise measured from those runs: half the range of the run medians over their median, the larger of the two
sides. With one run on a side its noise is the spread within the run (half the interquartile range of its
samples over the median). A change for the worse beyond twice the noise, and at least 5%, is flagged
REGRESSION; the exit code is then 1. Run a benchmark two or three times on each side to measure the noise."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from harness import Figure

MIN_CHANGE = 0.05
"""A change under 5% is never flagged: a figure with one sample has no measured noise."""


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
                Figure(f["name"], f["unit"], tuple(f["samples"]), f["lower_is_better"]))
    return found


def side(measured: list[Figure]) -> tuple[float, float]:
    """The median over runs and the run-to-run noise (relative) of one side."""
    medians = [f.median for f in measured]
    middle = statistics.median(medians)
    if len(medians) == 1:
        return middle, measured[0].noise()
    return middle, (max(medians) - min(medians)) / 2 / abs(middle) if middle else 0.0


def verdict(old: list[Figure], new: list[Figure]) -> tuple[float, float, float, float, bool]:
    """Old and new medians, the relative change, the noise it is judged against, and whether it regressed."""
    (before, old_noise), (after, new_noise) = side(old), side(new)
    change = (after - before) / abs(before) if before else 0.0
    noise = max(old_noise, new_noise)
    worse = change > 0 if old[0].lower_is_better else change < 0
    return before, after, change, noise, worse and abs(change) > max(2 * noise, MIN_CHANGE)


def compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """One line per figure measured on both sides, ``REGRESSION`` where it regressed."""
    before, after = figures(old), figures(new)
    lines = []
    for name in [n for n in before if n in after]:
        was, now, change, noise, regressed = verdict(before[name], after[name])
        lines.append(f"{'REGRESSION' if regressed else 'ok':10} {name}: {was:.4g} -> {now:.4g} "
                     f"{before[name][0].unit} ({change:+.1%}, noise ±{noise:.1%})")
    for name in sorted(set(before) ^ set(after)):
        lines.append(f"{'only in':10} {'old' if name in before else 'new'}: {name}")
    return lines


def describe(label: str, runs: list[dict[str, Any]]) -> str:
    revisions = sorted({run["revision"] for run in runs})
    loads = [run["machine"]["load"][0] for run in runs]
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
    lines = compare(old, new)
    print("\n".join(lines))
    return 1 if any(line.startswith("REGRESSION") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
