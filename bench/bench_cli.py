"""Time of `gpu-offload --help` from launch to exit, and of `gpu-offload quickstart` end to end.

`--help` is timed hyperfine-style: a warm-up run, then ``--runs`` fresh processes, median/min/max. Beside it,
in the same run, the cost the lazy parser avoids: a process that imports every command's module (what
``gpu-offload --help`` did before the CLI imported only the chosen command), and a bare interpreter.
With ``--quickstart N`` the README's first command runs N times (embedded sandbox, S3 store, real kernel).

Usage: .venv/bin/python bench/bench_cli.py [--runs 10] [--quickstart 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, Run, timed  # bench/harness.py: the script's folder is on sys.path

BIN = Path(sys.executable).parent
EAGER = ("import argparse; from gpu_offload.cli import COMMANDS; import importlib; "
         "[importlib.import_module(c.module) for c in COMMANDS]")


def launches(argv: list[str], runs: int, cwd: Path | None = None, warm: bool = True) -> list[float]:
    """Seconds from launch to exit of ``runs`` fresh processes (after one untimed warm-up: file cache, .pyc)."""
    def launch() -> None:
        subprocess.run(argv, capture_output=True, check=True, cwd=cwd)

    if warm:
        launch()
    wall, _ = timed(launch, runs)
    return [ms / 1000 for ms in wall]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quickstart", type=int, default=0, help="also run `gpu-offload quickstart` N times")
    args = parser.parse_args()
    run = Run("cli", "The first ten minutes: CLI launch and quickstart")
    run.figure("`gpu-offload --help`", launches([str(BIN / "gpu-offload"), "--help"], args.runs), "s")
    run.figure("import every command's module (the eager parser)", launches([sys.executable, "-c", EAGER], args.runs),
               "s")
    run.figure("`python -c pass` (interpreter start)", launches([sys.executable, "-c", "pass"], args.runs), "s")
    if args.quickstart:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [str(BIN / "gpu-offload"), "quickstart", "--output", f"{tmp}/out.ipynb"]
            times = launches(argv, args.quickstart, cwd=REPO, warm=False)
            run.figure("`gpu-offload quickstart` (sandbox, end to end)", times, "s")
    run.write()

if __name__ == "__main__":
    main()
