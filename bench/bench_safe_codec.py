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
import json
import resource
import statistics
import subprocess
import sys
from collections import OrderedDict
from typing import Any

from harness import Run, Stopwatch  # bench/harness.py: the script's folder is on sys.path


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
    watch = Stopwatch()
    back = round_trip(codec, value)
    wall, cpu = watch.seconds, watch.cpu_ms / 1000
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if kind == "array":
        assert np.array_equal(back, value)
    else:
        assert list(back) == list(value) and all(back[k].equal(v) for k, v in value.items())
    print(json.dumps({"wall": wall, "cpu": cpu, "peak": peak - base}))


def measure(kind: str, codec: str, mib: int, repeats: int) -> list[dict[str, float]]:
    """Wall and CPU seconds and peak MiB of ``repeats`` round trips, each in a fresh process."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--child", kind, codec, str(mib)],
                             check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


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
        watch = Stopwatch()
        for _ in range(mib * 2**20 // len(piece)):
            decoder.feed(piece)
        events = decoder.feed(b"\n" + lines[0])
        rates.append(mib * 2**20 / 1e6 / watch.seconds)
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
    run = Run("safe_codec", "Safe outputs beside the pickle path, and the frame decoder on an endless line")
    run.note(f"{args.repeats} round trips per row, each in a fresh process; peak = peak RSS above the RSS once "
             "the value exists")
    for kind in ("array", "state dict"):
        label = f"{args.mib} MiB {'float64 array' if kind == 'array' else 'state dict (64 float32 tensors)'}"
        rows = {codec: measure(kind.split()[0], codec, args.mib, args.repeats) for codec in ("pickle", "safe")}
        for codec, runs in rows.items():
            run.figure(f"{label}, {codec}: wall", [r["wall"] for r in runs], "s")
            run.figure(f"{label}, {codec}: CPU", [r["cpu"] for r in runs], "s")
            run.figure(f"{label}, {codec}: peak RSS above the value", [r["peak"] for r in runs], "MiB")
        ratio = (statistics.median(r["wall"] for r in rows["safe"])
                 / statistics.median(r["wall"] for r in rows["pickle"]))
        run.figure(f"{label}: safe / pickle wall, medians", ratio, "x")
        run.goal(f"{label}: safe / pickle wall", ratio, 1.2, "x")
    chunked, whole = frame_decoder_rate(args.line_mib)
    run.figure(f"frame decoder, one {args.line_mib} MiB line without newline, 64 KiB reads", chunked, "MB/s",
               lower_is_better=False)
    run.figure(f"frame decoder, one {args.line_mib} MiB line without newline, one chunk", whole, "MB/s",
               lower_is_better=False)
    run.note(f"frame decoder in 64 KiB reads {chunked:.0f} MB/s: "
             f"{'meets' if chunked >= 100 else 'misses'} the 100 MB/s goal")
    run.write()


if __name__ == "__main__":
    main()
