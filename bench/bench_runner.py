"""The runner's own share of an offloaded cell's overheads, measured at the pipe (no kernel, no engine).

- cold start: a one-shot runner on a trivial cell, from process start to its exit, against a bare
  ``python -I -c pass`` of the same interpreter;
- warm session: a trivial cell sent to a session runner (bundle bytes inline) until its ``done`` frame,
  against executing the same cell in this process;
- print-to-frame latency: a cell prints timestamped lines 2 ms apart; the reader compares each ``stream``
  frame's arrival with the timestamp inside it (CLOCK_MONOTONIC is shared by processes).

    python bench/bench_runner.py [--runs 200]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_offload.runner.build import build_runner
from gpu_offload.runner.bundle import encode_bundle, make_bundle
from gpu_offload.runner.frames import Done, FrameDecoder, Stream
from gpu_offload.runner.secrecy import greeting

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402  (one definition of the machine line)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_child(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system of the child) seconds of one process run to completion."""
    wall, cpu = time.perf_counter(), child_cpu()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - wall, child_cpu() - cpu


def cold_start(pyz: Path, runs: int) -> dict[str, list[tuple[float, float]]]:
    """A one-shot runner on a trivial cell, with and without an output (which needs cloudpickle)."""
    rows: dict[str, list[tuple[float, float]]] = {"bare": [], "runner": [], "runner, one output": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            rows["bare"].append(timed_child([sys.executable, "-I", "-c", "pass"]))
            for name, outputs in (("runner", []), ("runner, one output", ["x"])):
                path = Path(tmp) / "b.pkl"
                path.write_bytes(encode_bundle(make_bundle("x = 1", outputs=outputs)))
                rows[name].append(timed_child([sys.executable, "-I", str(pyz), "--bundle", str(path)]))
    return rows


class Session:
    def __init__(self, pyz: Path) -> None:
        self.nonce = secrets.token_hex(16)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(pyz), "--session"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(greeting(self.nonce))  # the session's nonce comes first on stdin
        self.decoder = FrameDecoder(self.nonce)
        self.pending: list[object] = []

    def send(self, cell: str) -> None:
        data = encode_bundle(make_bundle(cell, nonce=self.nonce, metrics_interval=3600))
        command = {"op": "run", "bundle_b64": base64.b64encode(data).decode()}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")

    def events(self):  # type: ignore[no-untyped-def]
        assert self.proc.stdout is not None
        while True:
            while self.pending:
                yield self.pending.pop(0)
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return
            self.pending = list(self.decoder.feed(chunk))
            # arrival time of the chunk, for the latency measurement
            self.arrived = time.perf_counter_ns()

    def run(self, cell: str) -> None:
        self.send(cell)
        for event in self.events():
            if isinstance(event, Done):
                return

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def warm(pyz: Path, runs: int) -> tuple[list[float], list[float]]:
    session = Session(pyz)
    session.run("x = 0")  # warm-up: imports, first note
    remote, local = [], []
    namespace: dict[str, object] = {"x": 0}
    code = compile("x = x + 1", "<cell>", "exec")
    for _ in range(runs):
        start = time.perf_counter()
        session.run("x = x + 1")
        remote.append(time.perf_counter() - start)
        start = time.perf_counter()
        exec(code, namespace)
        local.append(time.perf_counter() - start)
    session.close()
    return remote, local


def latency(pyz: Path, lines: int) -> list[float]:
    session = Session(pyz)
    session.run("import time")
    session.send(f"for i in range({lines}):\n    print(time.perf_counter_ns())\n    time.sleep(0.002)\n")
    delays = []
    for event in session.events():
        if isinstance(event, Stream):
            for stamp in event.text.split():
                delays.append((session.arrived - int(stamp)) / 1e6)
        if isinstance(event, Done):
            break
    session.close()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    pyz = build_runner()
    print(machine_line())
    print(f"date: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, runner: {pyz.name}\n")
    cold = cold_start(pyz, max(5, args.runs // 20))
    remote, local = warm(pyz, args.runs)
    delays = latency(pyz, args.runs)
    ms = 1e3
    print("| measure | runs | median ms | p95 ms | p99 ms | baseline median ms | added median ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("runner", "runner, one output"):
        for kind, index in (("wall", 0), ("CPU", 1)):
            values = [row[index] for row in cold[name]]
            base = statistics.median(row[index] for row in cold["bare"])
            print(
                f"| cold one-shot {name} (trivial cell), {kind}, vs `python -I -c pass` | {len(values)} | "
                f"{statistics.median(values) * ms:.1f} | {pct(values, 0.95) * ms:.1f} | - | "
                f"{base * ms:.1f} | {(statistics.median(values) - base) * ms:.1f} |"
            )
    print(
        f"| warm session trivial cell, bundle inline, until `done` vs exec in-process | {len(remote)} | "
        f"{statistics.median(remote) * ms:.2f} | {pct(remote, 0.95) * ms:.2f} | {pct(remote, 0.99) * ms:.2f} | "
        f"{statistics.median(local) * ms:.4f} | {(statistics.median(remote) - statistics.median(local)) * ms:.2f} |"
    )
    print(
        f"| print in the cell -> stream frame read from the pipe | {len(delays)} | "
        f"{statistics.median(delays):.3f} | {pct(delays, 0.95):.3f} | {pct(delays, 0.99):.3f} | - | - |"
    )


if __name__ == "__main__":
    main()
