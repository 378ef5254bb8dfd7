"""How fast a cold runner is ready: process start to its ``hello`` frame, and to the cell's start when the cell
uses torch (the runner imports it again before the cell runs), each beside the bare interpreter doing the same.

A one-shot runner gets its bundle on stdin (as the local backend starts it) and is read at the pipe:
- ``runner start``: spawn to the ``hello`` frame's arrival (the goal: at most 0.3 s on this machine);
- ``runner start, import torch``: spawn to the ``running`` status, after the runner imported torch
  (the goal: at most 1.5 s);
- peers in the same run: ``python -I -c pass`` and ``python -I -c "import torch"`` to completion;
- the runner's own ``boot`` (its process age at ``hello``, from /proc) and ``imports`` figures.

Wall time counts the other sessions sharing the CPU; the children's CPU time (user + system) does not, and
is reported beside it.

    python bench/bench_runner_start.py [--runs 15] [--no-torch]
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Run, timed_process  # noqa: E402

from gpu_offload.runner.build import build_runner  # noqa: E402
from gpu_offload.runner.bundle import encode_bundle, make_bundle  # noqa: E402
from gpu_offload.runner.frames import Done, FrameDecoder, Hello, Status  # noqa: E402

RUNNER_GOAL, TORCH_GOAL = 0.3, 1.5


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_runner(pyz: Path, modules: dict[str, str]) -> dict[str, float]:
    """One one-shot runner from spawn to exit: when its hello and its ``running`` status arrived."""
    nonce = secrets.token_hex(16)
    bundle = encode_bundle(make_bundle("x = 1", nonce=nonce, modules=modules, metrics_interval=3600))
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-I", str(pyz), "--bundle", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(bundle)
    proc.stdin.close()
    decoder, seen = FrameDecoder(nonce), {}
    while True:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        now = time.perf_counter() - start
        for event in decoder.feed(chunk):
            if isinstance(event, Hello):
                seen["hello"], seen["boot"] = now, event.boot if event.boot is not None else float("nan")
            elif isinstance(event, Status) and event.imports is not None:
                seen["running"], seen["imports"] = now, event.imports
            elif isinstance(event, Done):
                seen["done"] = now
    proc.wait()
    seen["cpu"] = children_cpu() - cpu
    if "running" not in seen:
        raise SystemExit(f"the runner did not start the cell (modules {modules}); exit code {proc.returncode}")
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--no-torch", action="store_true", help="leave out the torch figures")
    args = parser.parse_args()
    run = Run("runner_start", "Cold runner start: spawn to hello, and to the cell with torch imported")
    with tempfile.TemporaryDirectory() as tmp:
        pyz = build_runner(Path(tmp))
        cases = [("", {})] + ([] if args.no_torch else [(", import torch", {"torch": "torch"})])
        one_runner(pyz, dict(cases[-1][1]))  # page cache warm for both, as a user's second cell finds it
        rows: dict[str, list[dict[str, float]]] = {label: [] for label, _ in cases}
        bare: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in cases}
        for _ in range(args.runs):  # interleaved: a load spike hits runner and peer alike
            for label, modules in cases:
                rows[label].append(one_runner(pyz, modules))
                code = "import torch" if modules else "pass"
                done = timed_process([sys.executable, "-I", "-c", code])
                bare[label].append((done.wall, done.cpu))
    for label, _ in cases:
        seen = rows[label]
        ready = "running" if label else "hello"
        run.figure(f"runner start{label} wall", [s[ready] * 1000 for s in seen], "ms")
        run.figure(f"runner start{label} process CPU", [s["cpu"] * 1000 for s in seen], "ms")
        run.figure(f"bare python -c {'import torch' if label else 'pass'} wall", [w * 1000 for w, _ in bare[label]], "ms")
        run.figure(f"bare python -c {'import torch' if label else 'pass'} CPU", [c * 1000 for _, c in bare[label]], "ms")
        run.figure(f"runner{label}: its own boot (process age at hello)", [s["boot"] * 1000 for s in seen], "ms")
        if label:
            run.figure(f"runner{label}: its own import time", [s["imports"] * 1000 for s in seen], "ms")
    for label, _ in cases:
        goal = TORCH_GOAL if label else RUNNER_GOAL
        median = sorted(s["running" if label else "hello"] for s in rows[label])[len(rows[label]) // 2]
        verdict = "met" if median <= goal else "NOT met"
        run.note(f"runner start{label}: median {median:.3f} s against the goal {goal} s: {verdict}")
    run.note(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
