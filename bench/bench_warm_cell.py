"""A warm session's own cost per cell, this tree against an earlier revision and ipyparallel's ``%px``,
measured side by side in one run.

Each variant runs in its own process (an IPython shell with the magic on the local backend and a warm
session ``bench``; for the peer, ipyparallel with one local engine and ``%%px --stream``); the rounds
alternate between the variants, so a load spike on the shared machine hits all alike. Per round, per
variant:
- a trivial cell (``x = 1``) run in the shell itself, then through the warm session: wall time of each, and
  the CPU time (user + system) the kernel process and the session's runner (the peer's engine and
  controller) spent per cell; the kernel's CPU includes writing the cells' run records, which a tree with the
  run book's writer thread does off the cells' path (flushed and timed after the cells);
- print latency: the session cell prints timestamped lines 2 ms apart; each line's arrival at the shell's
  stdout minus its timestamp (CLOCK_REALTIME of one machine; the Jupyter client's iopub hop is not in it:
  ``bench/bench_local.py`` measures that one).

The machine is shared (load 15-20 on 2 cores while this was written): wall times count everyone's work,
CPU times only ours, so both are reported.

    python bench/bench_warm_cell.py --before REV [--rounds 6 --cells 100] [--no-peer]

``--before REV`` checks REV out in a temporary git worktree (removed afterwards); its process imports the
project from there through the tree's own folder map (setup.py ``ROOTS``), every dependency from this venv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PRINT_CELL = "import time\nfor _ in range({n}):\n    print(repr(time.time()))\n    time.sleep(0.002)"


# ----------------------------------------------------------------------------------------------- child side


class _Stamps:
    """Stands in for sys.stdout: the arrival time of every printed timestamp, minus the stamp."""

    def __init__(self) -> None:
        self.latencies: list[float] = []

    def write(self, text: str) -> int:
        now = time.time()
        for word in text.split():
            with contextlib.suppress(ValueError):  # the notices' words
                self.latencies.append((now - float(word)) * 1000)
        return len(text)

    def flush(self) -> None:
        pass


def child(tree: str | None, peer: bool) -> int:
    if tree:
        import_tree(Path(tree))
    import psutil
    from harness import timed  # the script's folder is on sys.path
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    real_stdout = sys.stdout
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the magic's notices; replies go to the real stdout
    if peer:  # ipyparallel: one local engine, its %px magic (output streamed as it arrives)
        import ipyparallel as ipp

        cluster = ipp.Cluster(n=1, log_level=40)
        client = cluster.start_and_connect_sync()
        client.wait_for_engines(1, timeout=120)
        view = client[:]
        view.block = True
        view.activate()
        magic, options = "px", "--stream"
    else:
        shell.run_line_magic("load_ext", "gpu_offload.magics")
        shell.run_line_magic("gpu_offload", "config backend=local")
        magic, options = "gpu_offload", "--session bench"
    for _ in range(20):
        shell.run_cell_magic(magic, options, "x = 1")
    # the session's runner, or the peer's engine and controller (psutil: 10 ms ticks)
    runners = psutil.Process().children(recursive=True)
    for line in sys.stdin:
        cells = int(line)
        kernel, cpu = timed(lambda: shell.run_cell("x = 1", store_history=False), cells)
        kernel_cpu = sum(cpu) / cells
        theirs = sum(sum(p.cpu_times()[:2]) for p in runners)
        warm, cpu = timed(lambda: shell.run_cell_magic(magic, options, "x = 1"), cells)
        warm_cpu = (sum(cpu) + (0.0 if peer else settle_writes())) / cells
        runner_cpu = (sum(sum(p.cpu_times()[:2]) for p in runners) - theirs) * 1000 / cells
        stamps = _Stamps()
        sys.stdout = stamps
        shell.run_cell_magic(magic, options, PRINT_CELL.format(n=cells))
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        if not peer:
            settle_writes()  # the print cell's record: not into the next round's plain cells
        real_stdout.write(json.dumps({"kernel": kernel, "warm": warm, "kernel_cpu": kernel_cpu,
                                      "warm_cpu": warm_cpu, "runner_cpu": runner_cpu,
                                      "print": stamps.latencies}) + "\n")
        real_stdout.flush()
    if peer:
        client.close()
        cluster.stop_cluster_sync()
    else:
        shell.run_line_magic("gpu_offload", "close --all")
    return 0


def settle_writes() -> float:
    """CPU ms spent writing the run records the warm cells left to the run book's writer thread (written off the
    cells' path since it has one): charged to the warm cells, and not left to disturb the print cell."""
    from harness import Stopwatch

    from gpu_offload.engine.runs.tracking import tracker

    clock = Stopwatch()
    with contextlib.suppress(TypeError):  # a tree without the writer: its flush takes a run and has nothing left
        tracker().flush()  # type: ignore[call-arg]
    return clock.cpu_ms


# ---------------------------------------------------------------------------------------------- parent side


def before_tree(rev: str, workdir: Path) -> Path:
    """REV checked out in a temporary worktree (the child imports the project from it: :func:`import_tree`)."""
    tree = workdir / "before"
    subprocess.run(["git", "-C", str(BENCH.parent), "worktree", "add", "--detach", str(tree), rev], check=True,
                   capture_output=True)
    return tree


def import_tree(tree: Path) -> None:
    """Import the project from ``tree`` (its setup.py folder map), ahead of the venv's own install."""
    import ast
    import importlib.abc
    import importlib.machinery
    import importlib.util

    setup = ast.parse((tree / "setup.py").read_text())
    roots = next(ast.literal_eval(node.value) for node in ast.walk(setup)
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ROOTS")
    folders = {name: tree / path for name, path in roots.items()}

    class TreeFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name in folders:
                init = folders[name] / "__init__.py"
                return importlib.util.spec_from_file_location(
                    name, init if init.exists() else None, submodule_search_locations=[str(folders[name])])
            if name.split(".")[0] in {n.split(".")[0] for n in folders} and path is not None:
                return importlib.machinery.PathFinder.find_spec(name, path)
            return None

    sys.meta_path.insert(0, TreeFinder())


class Variant:
    def __init__(self, name: str, tree: Path | None, peer: bool = False) -> None:
        self.name = name
        argv = [sys.executable, str(BENCH / "bench_warm_cell.py"), "--child", *(["--tree", str(tree)] if tree else []),
                *(["--peer"] if peer else [])]
        self.proc = subprocess.Popen(argv, cwd=tree or BENCH.parent,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": ""})
        self.rounds: list[dict[str, Any]] = []

    def round(self, cells: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{cells}\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise SystemExit(f"the {self.name} variant stopped (exit {self.proc.wait()})")
        self.rounds.append(json.loads(reply))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def samples(self, key: str) -> list[float]:
        return [x for r in self.rounds for x in (r[key] if isinstance(r[key], list) else [r[key]])]


def summarise(run: Any, variants: list[Variant]) -> None:
    from harness import percentile

    for v in variants:
        added = [statistics.median(r["warm"]) - statistics.median(r["kernel"]) for r in v.rounds]
        run.figure(f"{v.name}: warm cell added over the kernel, median per round, wall", added, "ms")
        run.figure(f"{v.name}: kernel CPU per warm cell", v.samples("warm_cpu"), "ms")
        run.figure(f"{v.name}: kernel CPU per plain cell", v.samples("kernel_cpu"), "ms")
        run.figure(f"{v.name}: runner CPU per warm cell", v.samples("runner_cpu"), "ms")
        run.figure(f"{v.name}: print latency", v.samples("print"), "ms")
        cpu_added = statistics.median(v.samples("warm_cpu")) - statistics.median(v.samples("kernel_cpu"))
        prints = v.samples("print")
        run.note(f"{v.name}: added wall median {statistics.median(added):.3f} ms (goal 0.5), kernel CPU added "
                 f"{cpu_added:.3f} ms + runner CPU {statistics.median(v.samples('runner_cpu')):.3f} ms per cell; "
                 f"print p99 {percentile(prints, 0.99):.2f} ms (goal 5), max {max(prints):.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-peer", action="store_true", help="leave out ipyparallel's %%px")
    parser.add_argument("--before", help="an earlier revision to run side by side (a temporary worktree)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cells", type=int, default=100)
    args = parser.parse_args()
    if args.child:
        return child(args.tree, args.peer)
    sys.path.insert(0, str(BENCH))
    from harness import Run

    run = Run("warm_cell", "A warm session's own cost per trivial cell and its print latency, before and after")
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        tree = before_tree(args.before, Path(tmp)) if args.before else None
        try:
            variants = ([Variant(f"before ({args.before})", tree)] if tree else [])
            variants.append(Variant("this tree", None))
            if not args.no_peer:
                variants.append(Variant("ipyparallel %px (peer)", None, peer=True))
            for _ in range(args.rounds):
                for v in variants:
                    v.round(args.cells)
            for v in variants:
                v.close()
        finally:
            if tree is not None:
                subprocess.run(["git", "-C", str(BENCH.parent), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
                shutil.rmtree(tree, ignore_errors=True)
    summarise(run, variants)
    run.note(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
