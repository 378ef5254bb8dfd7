"""Distributed cells on the local backend: launch to first line of a 2 x 2 CPU job, against torchrun.

The same script runs both ways, alternating, in one run: as a ``%%gpu_offload --nodes 2 --procs-per-node 2
--gpus 0`` cell through the engine (job built, two node launchers started, four ranks, frames decoded)
and as ``torchrun --standalone --nproc-per-node 4 script.py`` read from its stdout. Both times run from the
launch to the first line a rank prints after ``init_process_group("gloo")`` (so the torch import and the
rendezvous are in both), and to the end of the run.

    .venv/bin/python bench/bench_ranks.py            # 5 rounds
    .venv/bin/python bench/bench_ranks.py --rounds 9

Goal (issue 16): launch-to-first-line at most 1.5x torchrun's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_offload.magics.analysis import analyse_cell
from gpu_offload.magics.backends.local import LocalBackend
from gpu_offload.magics.execution import Launch, start
from gpu_offload.magics.request import OffloadRequest
from gpu_offload.magics.runner.frames import Done, Stream
from machine import machine_line  # bench/machine.py: the script's folder is on sys.path

SCRIPT = """\
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} ready", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
GOAL = 1.5


def ours(backend: LocalBackend) -> tuple[float, float]:
    """Seconds from the launch to the first rank's line, and to the run's ``done``."""
    request = OffloadRequest(SCRIPT, gpus=0, nodes=2, procs_per_node=2, quiet_ranks=False)
    begin = time.perf_counter()
    run, _refs = start(request, Launch(analyse_cell(SCRIPT, {})), {}, backend)
    first = None
    while True:
        event = run.next_event(1.0)
        if isinstance(event, Stream) and first is None:
            first = time.perf_counter() - begin
        if isinstance(event, Done):
            assert event.status == "ok", event
            break
    end = time.perf_counter() - begin
    run.release(10.0)
    assert first is not None
    return first, end


def torchrun(script: Path) -> tuple[float, float]:
    """The same for ``torchrun --standalone --nproc-per-node 4``."""
    binary = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    begin = time.perf_counter()
    proc = subprocess.Popen([binary, "--standalone", "--nproc-per-node", "4", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    first = None
    for line in proc.stdout:
        if first is None and b"ready" in line:
            first = time.perf_counter() - begin
    code = proc.wait()
    end = time.perf_counter() - begin
    assert code == 0 and first is not None, code
    return first, end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine_line())
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    backend = LocalBackend()
    backend.runner_path()  # built once, as a kernel's first cell would
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ready.py"
        script.write_text(SCRIPT)
        ours(backend), torchrun(script)  # warm the page cache for both
        results: dict[str, list[tuple[float, float]]] = {"gpu_offload 2 x 2": [], "torchrun 1 x 4": []}
        for _ in range(args.rounds):
            results["gpu_offload 2 x 2"].append(ours(backend))
            results["torchrun 1 x 4"].append(torchrun(script))
    print(f"rounds: {args.rounds} (alternating); times in seconds\n")
    print("| launcher | first line median | first line min | first line max | end median |")
    print("|---|---:|---:|---:|---:|")
    medians = {}
    for name, runs in results.items():
        firsts = [first for first, _ in runs]
        medians[name] = statistics.median(firsts)
        print(f"| {name} | {medians[name]:.2f} | {min(firsts):.2f} | {max(firsts):.2f} | "
              f"{statistics.median(end for _, end in runs):.2f} |")
    ratio = medians["gpu_offload 2 x 2"] / medians["torchrun 1 x 4"]
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"\nlaunch to first line, ours / torchrun: {ratio:.2f}x ({verdict} the {GOAL}x goal)")


if __name__ == "__main__":
    main()
