"""How fast a cold runner is ready: process start to its ``hello`` frame, and to the cell's start when the cell
uses torch (the runner imports it again before the cell runs), each beside the bare interpreter doing the same.

A one-shot runner gets its bundle on stdin (as the local backend starts it) and is read at the pipe:
- ``runner start``: spawn to the ``hello`` frame's arrival (the goal: at most 0.3 s on this machine);
- ``runner start, import torch``: spawn to the ``running`` status, after the runner imported torch
  (the goal: at most 1.5 s); this tree's runner gets the ``--preimport`` the local backend gives it for such
  a cell (``engine.preimport.chosen``), an earlier revision's runner the command line it knew;
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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Run, Stopwatch, timed_process  # noqa: E402

from gpu_offload.engine.analysis import CellAnalysis  # noqa: E402
from gpu_offload.engine.preimport import chosen  # noqa: E402
from gpu_offload.runner.build import build_runner  # noqa: E402
from gpu_offload.runner.bundle import encode_bundle, make_bundle  # noqa: E402
from gpu_offload.runner.frames import Done, FrameDecoder, Hello, Status  # noqa: E402

RUNNER_GOAL, TORCH_GOAL = 0.3, 1.5


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_runner(pyz: Path, modules: dict[str, str], ahead: bool = True) -> dict[str, float]:
    """One one-shot runner from spawn to exit: when its hello and its ``running`` status arrived. ``ahead``:
    the runner knows ``--preimport`` (this tree's), and gets it as the local backend would give it."""
    nonce = secrets.token_hex(16)
    bundle = encode_bundle(make_bundle("x = 1", nonce=nonce, modules=modules, metrics_interval=3600))
    preimport = chosen(CellAnalysis(inputs=(), modules=modules)) if ahead else ()
    extra = ["--preimport", ",".join(preimport)] if preimport else []
    cpu = children_cpu()
    start = Stopwatch()
    proc = subprocess.Popen([sys.executable, "-I", str(pyz), "--bundle", "-", *extra], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(bundle)
    proc.stdin.close()
    decoder, seen = FrameDecoder(nonce), {}
    while True:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        now = start.seconds
        for event in decoder.feed(chunk):
            if isinstance(event, Hello):
                seen["hello"], seen["boot"] = now, event.boot if event.boot is not None else float("nan")
            elif isinstance(event, Status) and event.state == "running" and "running" not in seen:
                # an earlier revision's runner sends no import time: NaN
                seen["running"], seen["imports"] = now, event.imports if event.imports is not None else float("nan")
            elif isinstance(event, Done):
                seen["done"] = now
    proc.wait()
    seen["cpu"] = children_cpu() - cpu
    if "running" not in seen:
        raise SystemExit(f"the runner did not start the cell (modules {modules}); exit code {proc.returncode}")
    return seen


def before_runner(rev: str, workdir: Path) -> Path:
    """The runner zipapp of an earlier revision, built from it in a temporary git worktree."""
    from bench_warm_cell import before_tree

    tree = before_tree(rev, workdir)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from bench_warm_cell import import_tree; "
            "from pathlib import Path; import_tree(Path(sys.argv[2])); "
            "from gpu_offload.runner.build import build_runner; print(build_runner(Path(sys.argv[3])))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(tree),
                          str(workdir / "pyz")], check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    return Path(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--no-torch", action="store_true", help="leave out the torch figures")
    parser.add_argument("--before", help="an earlier revision whose runner starts side by side (temporary worktree)")
    args = parser.parse_args()
    run = Run("runner_start", "Cold runner start: spawn to hello, and to the cell with torch imported")
    with tempfile.TemporaryDirectory() as tmp:
        runners = {"runner": build_runner(Path(tmp))}
        try:
            if args.before:
                runners[f"runner of {args.before}"] = before_runner(args.before, Path(tmp))
            measure(run, runners, args)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(Path(__file__).resolve().parent.parent), "worktree", "remove",
                                "--force", str(Path(tmp) / "before")], capture_output=True)
    run.note(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    run.write()
    return 0


def measure(run: Run, runners: dict[str, Path], args: argparse.Namespace) -> None:
    cases = [("", {})] + ([] if args.no_torch else [(", import torch", {"torch": "torch"})])
    for name, pyz in runners.items():
        one_runner(pyz, dict(cases[-1][1]), name == "runner")  # page cache warm for all, as a user's second cell finds it
    rows: dict[tuple[str, str], list[dict[str, float]]] = {(n, c): [] for n in runners for c, _ in cases}
    bare: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in cases}
    for _ in range(args.runs):  # interleaved: a load spike hits every runner and the peer alike
        for label, modules in cases:
            for name, pyz in runners.items():
                rows[name, label].append(one_runner(pyz, modules, name == "runner"))
            done = timed_process([sys.executable, "-I", "-c", "import torch" if modules else "pass"])
            bare[label].append((done.wall, done.cpu))
    for label, _ in cases:
        ready = "running" if label else "hello"
        peer = f"bare python -c {'import torch' if label else 'pass'}"
        run.figure(f"{peer} wall", [w * 1000 for w, _ in bare[label]], "ms")
        run.figure(f"{peer} CPU", [c * 1000 for _, c in bare[label]], "ms")
        for name in runners:
            seen = rows[name, label]
            run.figure(f"{name} start{label} wall", [s[ready] * 1000 for s in seen], "ms")
            run.figure(f"{name} start{label} process CPU (to exit)", [s["cpu"] * 1000 for s in seen], "ms")
            for key, what in (("boot", "its own boot (process age at hello)"), ("imports", "its own import time")):
                own = [s[key] * 1000 for s in seen if key in s and s[key] == s[key]]
                if own and (label or key == "boot"):  # an earlier revision's runner reports neither (NaN)
                    run.figure(f"{name}{label}: {what}", own, "ms")
            goal = TORCH_GOAL if label else RUNNER_GOAL
            median = statistics.median(s[ready] for s in seen)
            run.note(f"{name} start{label}: median {median:.3f} s against the goal {goal} s: "
                     f"{'met' if median <= goal else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
