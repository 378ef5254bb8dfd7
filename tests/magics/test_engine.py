"""`%gpu_offload status` describes the last run, including GPU metrics (no GPU here: built from frames)."""

from __future__ import annotations

import secrets

from gpu_offload.magics.engine import Outcome, describe
from gpu_offload.magics.runner.frames import FrameDecoder, FrameEncoder, Hello, Metrics


def test_status_lines_name_the_runner_and_each_gpu_even_with_missing_fields() -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    encoder.emit("hello", python="3.11.7", pid=42, gpus=["NVIDIA A100-SXM4-40GB"], session=False)
    gpu = {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "util": 87.0, "mem_used": 10 * 2**30}
    encoder.emit("metrics", gpu=[{**gpu, "mem_total": 40 * 2**30, "temp": 65.0, "power": None}])
    decoder = FrameDecoder(nonce)
    events = [event for line in lines for event in decoder.feed(line)]
    hello = next(e for e in events if isinstance(e, Hello))
    metrics = next(e for e in events if isinstance(e, Metrics))
    text = describe(Outcome(status="ok", elapsed=1.5, hello=hello, metrics=metrics))
    assert "last run: ok in 1.50 s" in text
    assert "runner: Python 3.11.7, pid 42, GPUs: NVIDIA A100-SXM4-40GB" in text
    assert "GPU 0 NVIDIA A100-SXM4-40GB: 87% busy, 10.0/40.0 GiB, 65 C, ? W" in text
