"""Time of `gpu-offload --help` from launch to exit, and of `gpu-offload quickstart` end to end.

`--help` is timed hyperfine-style: a warm-up run, then ``--runs`` fresh processes, median/min/max. Beside it,
in the same run, the cost the lazy parser avoids: a process that imports every command's module (what
``gpu-offload --help`` did before the CLI imported only the chosen command), and a bare interpreter.
With ``--quickstart N`` the README's first command runs N times (embedded sandbox, S3 store, real kernel).

Usage: .venv/bin/python bench/bench_cli.py [--runs 10] [--quickstart 1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_line

BIN = Path(sys.executable).parent
EAGER = ("import argparse; from gpu_offload.cli import COMMANDS; import importlib; "
         "[importlib.import_module(c.module) for c in COMMANDS]")


def timed(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, capture_output=True, check=True)  # warm-up: the file cache, .pyc files
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def row(name: str, times: list[float]) -> str:
    return (f"| {name} | {len(times)} | {statistics.median(times):.3f} | {min(times):.3f} | "
            f"{max(times):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quickstart", type=int, default=0, help="also run `gpu-offload quickstart` N times")
    args = parser.parse_args()
    print(machine_line())
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    print("| command | runs | median s | min s | max s |\n|---|---:|---:|---:|---:|")
    help_times = timed([str(BIN / "gpu-offload"), "--help"], args.runs)
    print(row("`gpu-offload --help`", help_times), flush=True)
    print(row("import every command's module (the eager parser)", timed([sys.executable, "-c", EAGER], args.runs)),
          flush=True)
    print(row("`python -c pass` (interpreter start)", timed([sys.executable, "-c", "pass"], args.runs)), flush=True)
    if args.quickstart:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [str(BIN / "gpu-offload"), "quickstart", "--output", f"{tmp}/out.ipynb"]
            times = []
            for _ in range(args.quickstart):
                start = time.perf_counter()
                subprocess.run(argv, capture_output=True, check=True, cwd=Path(__file__).resolve().parents[1])
                times.append(time.perf_counter() - start)
            print(row("`gpu-offload quickstart` (sandbox, end to end)", times))
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}")


if __name__ == "__main__":
    main()
