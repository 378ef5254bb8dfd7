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
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_offload.runner.build import build_runner
from gpu_offload.runner.bundle import encode_bundle, make_bundle
from gpu_offload.runner.frames import Done, FrameDecoder, Stream
from gpu_offload.runner.secrecy import greeting

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # bench/harness.py: the script's folder is on sys.path
    Run,
    Stopwatch,
    clock,
    timed_process,
)


def timed_child(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system of the child) seconds of one process run to completion."""
    ran = timed_process(argv, check=True)
    return ran.wall, ran.cpu


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
            self.arrived = round(clock() * 1e9)  # the clock of the runner's time.perf_counter_ns()

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
        start = Stopwatch()
        session.run("x = x + 1")
        remote.append(start.seconds)
        start = Stopwatch()
        exec(code, namespace)
        local.append(start.seconds)
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
    run = Run("runner", "Runner: cold start, warm session, print latency")
    run.note(f"runner: {pyz.name}")
    cold = cold_start(pyz, max(5, args.runs // 20))
    remote, local = warm(pyz, args.runs)
    delays = latency(pyz, args.runs)
    ms = 1e3
    for kind, index in (("wall", 0), ("CPU", 1)):
        run.figure(f"cold `python -I -c pass`, {kind}", [row[index] * ms for row in cold["bare"]], "ms")
        for name in ("runner", "runner, one output"):
            run.figure(f"cold one-shot {name} (trivial cell), {kind}", [row[index] * ms for row in cold[name]], "ms")
    run.figure("warm session trivial cell, bundle inline, until `done`", [v * ms for v in remote], "ms")
    run.figure("the same cell executed in-process (baseline)", [v * ms for v in local], "ms")
    run.figure("print in the cell -> stream frame read from the pipe", delays, "ms")
    run.write()

if __name__ == "__main__":
    main()
