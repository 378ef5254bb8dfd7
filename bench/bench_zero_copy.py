"""numpy round trips through a warm local session (`b = a`), against `a.copy()` in the same run.

Two kinds of `a`, side by side:
- "made in the notebook": an array the kernel allocated itself. Its first trip copies it once into shared
  memory (there is no way to share memory a process already owns); it comes back without a copy.
- "came back from a cell": an array that a cell returned, which the kernel holds in shared memory while the
  variable lives (runner/lending.py). Unless the notebook wrote to it, it is lent by name: no copy either way.
The goal (issue 29): round trip <= 0.6x `a.copy()` at every size >= 64 MiB, median of >= 5 runs. The peer in the
same run, interleaved: ipyparallel with one local engine, ``push`` + ``%px b = a`` + ``pull`` (bench_local.Peer).

Run: ``.venv/bin/python bench/bench_zero_copy.py [--max-mib 256] [--runs 7] [--no-peer]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
from bench_local import Peer
from harness import Run, timed  # bench/harness.py: the script's folder is on sys.path

MIB = 1 << 20
GOAL = 0.6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-peer", action="store_true", help="leave out ipyparallel")
    args = parser.parse_args(argv)
    from IPython.core.interactiveshell import InteractiveShell

    run = Run("zero_copy", "numpy round trips `b = a` through a warm local session against a.copy()")
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpu_offload.magics")
    shell.run_line_magic("gpu_offload", "config backend=local")
    trip = lambda: shell.run_cell_magic("gpu_offload", "--session zc", "b = a")  # noqa: E731
    peer = None if args.no_peer else Peer(shell)
    print("\n| size MiB | a | a.copy() ms | round trip ms | trip/copy | peer/copy |")
    print("|---:|---|---:|---:|---:|---:|")
    worst = 0.0
    try:
        shell.run_cell_magic("gpu_offload", "--session zc", "x = 1")
        size = 16
        while size <= args.max_mib:
            made = np.random.default_rng(size).random(size * MIB // 8)
            peers: list[float] = []
            for kind in ("made in the notebook", "came back from a cell"):
                copies, trips = [], []
                for _ in range(args.runs):  # interleaved, so load from neighbours hits every column alike
                    if kind == "made in the notebook":
                        shell.user_ns["a"] = made
                        if peer is not None:  # the peer copies either kind alike: measured once per size
                            peers += timed(lambda made=made: peer.round_trip(made), 1)[0]
                    copies += timed(shell.user_ns["a"].copy, 1)[0]
                    trips += timed(trip, 1)[0]
                    shell.user_ns["a"] = shell.user_ns["b"]  # from now on `a` lives in shared memory
                assert np.array_equal(shell.user_ns["b"], made)
                copy, ours = statistics.median(copies), statistics.median(trips)
                label = "held" if kind == "came back from a cell" else "made"
                run.figure(f"{size} MiB {label}: a.copy()", copies, "ms")
                run.figure(f"{size} MiB {label}: round trip", trips, "ms")
                run.figure(f"{size} MiB {label}: trip/copy", ours / copy, "ratio")
                if size >= 64 and kind == "came back from a cell":
                    worst = max(worst, ours / copy)
                theirs = f"{statistics.median(peers) / copy:.2f}" if peers else "-"
                print(f"| {size} | {kind} | {copy:.2f} | {ours:.2f} | {ours / copy:.2f} | {theirs} |", flush=True)
            if peers:
                run.figure(f"{size} MiB: peer push + %px + pull", peers, "ms")
                run.figure(f"{size} MiB: peer / a.copy()", statistics.median(peers) / copy, "ratio")
            shell.user_ns.pop("a", None)
            shell.user_ns.pop("b", None)
            size *= 2
    finally:
        shell.run_line_magic("gpu_offload", "close --all")
        if peer is not None:
            peer.stop()
    verdict = "meets" if worst <= GOAL else "misses"
    run.note(f"worst trip/copy at >= 64 MiB for arrays that came back from a cell: {worst:.2f}: {verdict} "
             f"the {GOAL}x goal (arrays made in the notebook pay one copy on their first trip)")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
