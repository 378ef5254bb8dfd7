"""Safe outputs (src/gpu_offload/runner/safe.py + src/gpu_offload/engine/trust/decode.py) beside today's pickle path, and the frame
decoder on an endless line.

Each codec row is one value sent back from a cell and decoded in the kernel, in memory (no transport):
"pickle" is today's path for a cluster run (``buffers.dump(..., "inline")`` then ``buffers.load``, i.e.
cloudpickle protocol 5 with the buffers in band); "safe" is ``safe.encode(...).tobytes()`` then
``decode(...)``. Every measurement runs in a fresh subprocess so its peak RSS is its own; the peak is
given above the RSS once the value exists. Goal (issue 13): safe within 1.2x of pickle in time, and the
frame decoder at 100 MB/s or more on one unterminated line.

    python bench/bench_safe_codec.py            # 1 GiB array and 1 GiB state dict (needs ~5 GiB free)
    python bench/bench_safe_codec.py --mib 64   # smaller values
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import statistics
import subprocess
import sys
import time
from collections import OrderedDict
from typing import Any

from harness import machine_line  # bench/harness.py: the script's folder is on sys.path


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def make_value(kind: str, mib: int) -> Any:
    import numpy as np
    import torch

    if kind == "array":
        return np.random.default_rng(0).random(mib * 2**20 // 8)
    # a state dict of 64 float32 tensors, as a model's weights come back
    per = mib * 2**20 // 4 // 64
    return OrderedDict((f"layer{i}.weight", torch.rand(per)) for i in range(64))


def round_trip(codec: str, value: Any) -> Any:
    if codec == "pickle":
        from gpu_offload.runner import buffers

        dumped = buffers.dump({"x": value}, "inline")
        return buffers.load(dumped.pickle, [])["x"]
    from gpu_offload.engine.trust.decode import decode
    from gpu_offload.runner.safe import encode

    data = encode({"x": value}).tobytes()
    return decode(data, wanted={"x"}).values["x"]


def child(kind: str, codec: str, mib: int) -> None:
    """One measurement: time and peak RSS of one round trip, printed as JSON."""
    import numpy as np

    value = make_value(kind, mib)
    base = rss_mib()
    wall, cpu = time.perf_counter(), time.process_time()
    back = round_trip(codec, value)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if kind == "array":
        assert np.array_equal(back, value)
    else:
        assert list(back) == list(value) and all(back[k].equal(v) for k, v in value.items())
    print(json.dumps({"wall": wall, "cpu": cpu, "peak": peak - base}))


def measure(kind: str, codec: str, mib: int, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--child", kind, codec, str(mib)],
                             check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    row = {key: statistics.median(r[key] for r in runs) for key in ("wall", "cpu", "peak")}
    row["min"] = min(r["wall"] for r in runs)  # the run least disturbed by the machine's other work
    return row


def frame_decoder_rate(mib: int) -> tuple[float, float]:
    """MB/s of FrameDecoder.feed on one line of ``mib`` MiB without a newline, in 64 KiB reads (as the
    local backend reads its pipe) and in one chunk; then the frames after it still decode."""
    import secrets

    from gpu_offload.runner.frames import Done, FrameDecoder, FrameEncoder

    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    FrameEncoder(nonce, lines.append).emit("done", status="ok", elapsed=0)
    chunk = b"z" * (1 << 16)
    rates = []
    for size in (len(chunk), mib * 2**20):
        piece = chunk if size == len(chunk) else b"z" * size
        decoder = FrameDecoder(nonce)
        start = time.perf_counter()
        for _ in range(mib * 2**20 // len(piece)):
            decoder.feed(piece)
        events = decoder.feed(b"\n" + lines[0])
        rates.append(mib * 2**20 / 1e6 / (time.perf_counter() - start))
        assert isinstance(events[-1], Done)
    return rates[0], rates[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--line-mib", type=int, default=256)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "CODEC", "MIB"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    print(machine_line())
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; median of {args.repeats} "
          "(and the least wall time), each in a fresh process; peak = peak RSS above the RSS once the value "
          "exists; ratios against pickle")
    print()
    print("| value | codec | wall s | min wall s | CPU s | peak MiB | wall vs pickle | min wall | CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in ("array", "state dict"):
        label = f"{args.mib} MiB {'float64 array' if kind == 'array' else 'state dict (64 float32 tensors)'}"
        rows = {codec: measure(kind.split()[0], codec, args.mib, args.repeats) for codec in ("pickle", "safe")}
        for codec, row in rows.items():
            ratios = " | ".join(f"{row[k] / rows['pickle'][k]:.2f}x" for k in ("wall", "min", "cpu"))
            print(f"| {label} | {codec} | {row['wall']:.2f} | {row['min']:.2f} | {row['cpu']:.2f} | "
                  f"{row['peak']:.0f} | {ratios} |")
    chunked, whole = frame_decoder_rate(args.line_mib)
    print()
    print(f"frame decoder, one {args.line_mib} MiB line without newline: {chunked:.0f} MB/s in 64 KiB reads, "
          f"{whole:.0f} MB/s in one chunk")
    print(f"machine at the end: {machine_line()}")


if __name__ == "__main__":
    main()
