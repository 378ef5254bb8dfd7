"""Local backend benchmarks: overhead, numpy round trips and print latency, against ipyparallel ``%px``.

Writes one JSON result (bench/harness.py: figures, machine and date); ratios are ours/peer measured in the
same run.

    .venv/bin/python bench/bench_local.py              # arrays up to 256 MiB
    .venv/bin/python bench/bench_local.py --max-mib 1024
    .venv/bin/python bench/bench_local.py --no-peer    # skip ipyparallel

Goals (issue 2): warm-session overhead of a trivial cell <= 2 ms median added over running it in the kernel;
numpy round trip <= 2x ``a.copy()`` at >= 64 MiB; print-to-display latency p99 <= 20 ms at a Jupyter client.
"""

from __future__ import annotations

import argparse
import queue
import re
import statistics
import time
from typing import Any

import numpy as np
import psutil
from harness import Run, Stopwatch, kernel, percentile, wall_ms  # bench/harness.py (on sys.path)

MIB = 1 << 20
FLOAT = re.compile(r"\d{9,}\.\d+")


class Peer:
    """ipyparallel with one local engine, driven the way a user would: ``%px`` and push/pull."""

    def __init__(self, shell: Any) -> None:
        import ipyparallel as ipp

        clock = Stopwatch()
        self.cluster = ipp.Cluster(n=1, log_level=40)
        self.client = self.cluster.start_and_connect_sync()
        self.client.wait_for_engines(1, timeout=120)
        self.view = self.client[:]
        self.view.block = True
        self.view.execute("x = 1")
        self.cold_ms = clock.ms
        self.view.activate()  # registers %px on the shell
        self.shell = shell

    def trivial(self) -> None:
        self.shell.run_cell_magic("px", "", "x = 1")

    def round_trip(self, array: np.ndarray) -> np.ndarray:
        self.view.push({"a": array})
        self.shell.run_cell_magic("px", "", "b = a")
        return self.view.pull("b")[0]  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.client.close()
        self.cluster.stop_cluster_sync()


def session_pid(shell: Any, name: str) -> int:
    """The pid of a local session's runner, from ``%gpu_offload sessions``."""
    from IPython.utils.capture import capture_output

    with capture_output() as listing:
        shell.run_line_magic("gpu_offload", "sessions")
    found = re.search(rf"session {name}: local pid (\d+)", listing.stdout)
    assert found, listing.stdout
    return int(found.group(1))


def overhead(run: Run, shell: Any, peer: Peer | None, runs: int) -> None:
    shell.run_cell_magic("gpu_offload", "--session bench", "x = 1")
    if peer is not None:
        peer.trivial()
    plain_clock = Stopwatch()
    base = wall_ms(lambda: shell.run_cell("x = 1", store_history=False), runs)
    cpu_plain = plain_clock.cpu_ms / runs
    runner = psutil.Process(session_pid(shell, "bench"))
    warm_clock, cpu_runner = Stopwatch(), sum(runner.cpu_times()[:2])
    warm = wall_ms(lambda: shell.run_cell_magic("gpu_offload", "--session bench", "x = 1"), runs)
    cpu_kernel = warm_clock.cpu_ms / runs
    cpu_runner = (sum(runner.cpu_times()[:2]) - cpu_runner) * 1000 / runs
    cold = wall_ms(lambda: shell.run_cell_magic("gpu_offload", "", "x = 1"), max(3, runs // 20))
    px = wall_ms(peer.trivial, runs) if peer is not None else None
    kernel = statistics.median(base)
    run.figure("trivial cell (`x = 1`) in the kernel", base, "ms")
    run.figure("trivial cell, warm session", warm, "ms")
    run.figure("trivial cell, cold (new runner, no torch)", cold, "ms")
    warm_added = statistics.median(warm) - kernel
    run.figure("warm session added over the kernel, median", warm_added, "ms")
    if px is not None and peer is not None:
        run.figure("trivial cell, %px (peer)", px, "ms")
        peer_added = statistics.median(px) - kernel
        run.figure("%px added over the kernel, median", peer_added, "ms")
        run.figure("ipyparallel cluster start + first execute (peer's cold, once)", peer.cold_ms, "ms")
        run.note(f"warm added median: ours {warm_added:.3f} ms, %px {peer_added:.3f} ms, ours/peer "
                 f"{warm_added / peer_added:.2f}")
    run.goal("warm session added over the kernel, median", warm_added, 2.0)
    run.figure("kernel CPU per warm cell", cpu_kernel, "ms")
    run.figure("kernel CPU per plain cell", cpu_plain, "ms")
    run.figure("runner CPU per warm cell", cpu_runner, "ms")


def round_trips(run: Run, shell: Any, peer: Peer | None, max_mib: int, runs: int) -> None:
    size, worst = 1, 0.0
    while size <= max_mib:
        array = np.random.default_rng(0).random(size * MIB // 8)
        shell.user_ns["a"] = array
        offload = lambda: shell.run_cell_magic("gpu_offload", "--session bench", "b = a")  # noqa: E731
        copies: list[float] = []
        trips: list[float] = []
        peers: list[float] = []
        # interleaved, so that a burst of load from the neighbours hits every column alike
        for _ in range(runs):
            copies += wall_ms(array.copy, 1)
            trips += wall_ms(offload, 1)
            if peer is not None:
                peers += wall_ms(lambda array=array: peer.round_trip(array), 1)
        assert np.array_equal(shell.user_ns.pop("b"), array)
        run.figure(f"{size} MiB: a.copy()", copies, "ms")
        run.figure(f"{size} MiB: round trip `b = a`, warm session", trips, "ms")
        ours = statistics.median(trips) / statistics.median(copies)
        run.figure(f"{size} MiB: round trip / a.copy(), medians", ours, "x")
        if peers:
            run.figure(f"{size} MiB: peer push + %px + pull", peers, "ms")
            run.figure(f"{size} MiB: peer / a.copy(), medians", statistics.median(peers) / statistics.median(copies),
                       "x")
        if size >= 64:
            worst = max(worst, ours)
        size *= 4 if size < 64 else 2
    shell.user_ns.pop("a", None)
    if worst:
        run.goal("worst round trip / a.copy() at >= 64 MiB", worst, 2.0, "x")


LATENCY_CELL = (
    "import time\nfor i in range({n}):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.01)"
)


def _latencies(client: Any, code: str) -> list[float]:
    """Receive time minus print time of each printed timestamp, the first time the client sees it."""
    msg_id = client.execute(code)
    seen: set[str] = set()
    found: list[float] = []
    while True:
        try:
            msg = client.get_iopub_msg(timeout=120)
        except queue.Empty:
            raise SystemExit("kernel went silent for 120 s during the latency benchmark") from None
        received = time.time()
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            return found
        # %px shows engine output as a display that it updates with each new line
        text = content.get("text", "") if kind == "stream" else content.get("data", {}).get("text/plain", "")
        for stamp in FLOAT.findall(text):
            if stamp not in seen:
                seen.add(stamp)
                found.append((received - float(stamp)) * 1000)


def latency(run: Run, lines: int, with_peer: bool) -> None:
    with kernel("%load_ext gpu_offload.magics\n%gpu_offload config backend=local") as client:
        client.execute_interactive("%%gpu_offload --session lat\nx = 1", timeout=120)
        ours = _latencies(client, "%%gpu_offload --session lat\n" + LATENCY_CELL.format(n=lines))
        local = _latencies(client, LATENCY_CELL.format(n=lines))
        peer: list[float] = []
        if with_peer:
            setup = (
                "import ipyparallel as ipp\n_rc = ipp.Cluster(n=1, log_level=40).start_and_connect_sync()\n"
                "_rc.wait_for_engines(1, timeout=120)\n_v = _rc[:]\n_v.block = True\n_v.activate()"
            )
            client.execute_interactive(setup, timeout=300)
            peer = _latencies(client, "%%px\n" + LATENCY_CELL.format(n=lines))
            client.execute_interactive("_rc.cluster.stop_cluster_sync()", timeout=120)
        client.execute_interactive("%gpu_offload close lat", timeout=60)
    # `print` then a 10 ms sleep per line; receive time at a Jupyter client (iopub) minus print time
    for name, values in (("in the kernel (no flush)", local), ("%%gpu_offload session", ours), ("%%px (peer)", peer)):
        if values:
            run.figure(f"print-to-display latency, {name}", values, "ms")
    if ours and peer:
        run.note(f"print-to-display p99 ours/peer: {percentile(ours, 0.99) / percentile(peer, 0.99):.2f}")
    if ours:
        run.goal("print-to-display p99, %%gpu_offload session", percentile(ours, 0.99), 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-mib", type=int, default=256, help="largest array (default 256; 1024 for 1 GiB)"
    )
    parser.add_argument("--runs", type=int, default=200, help="runs of the trivial cell (default 200)")
    parser.add_argument("--array-runs", type=int, default=5, help="runs per array size (default 5)")
    parser.add_argument("--lines", type=int, default=300, help="printed lines for the latency test")
    parser.add_argument("--no-peer", action="store_true", help="skip ipyparallel")
    parser.add_argument("--parts", default="overhead,arrays,latency", help="comma-separated parts to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    from IPython.core.interactiveshell import InteractiveShell

    run = Run("local", "Local backend against ipyparallel %px: overhead, numpy round trips, print latency")
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpu_offload.magics")
    shell.run_line_magic("gpu_offload", "config backend=local")
    if parts & {"overhead", "arrays"}:
        peer = None if args.no_peer else Peer(shell)
        try:
            if "overhead" in parts:
                overhead(run, shell, peer, args.runs)
            if "arrays" in parts:
                round_trips(run, shell, peer, args.max_mib, args.array_runs)
        finally:
            shell.run_line_magic("gpu_offload", "close --all")
            if peer is not None:
                peer.stop()
    if "latency" in parts:
        latency(run, args.lines, not args.no_peer)
    run.write()


if __name__ == "__main__":
    main()
