"""A process of its own that runs the kernel's decoders on hostile input, so a crash fails a test instead of
killing pytest.

Requests on stdin: ``<u32 kind length><u32 data length><kind><data>``; one JSON line per request on stdout:
what came back (a summary, never the values), how long the decode took and how far the process's peak
resident memory rose above what it held before (``VmHWM`` reset through ``/proc/self/clear_refs``).
"""

from __future__ import annotations

import json
import re
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

_KIB = re.compile(r"(VmHWM|VmRSS):\s+(\d+) kB")


def _memory() -> dict[str, int]:
    with open("/proc/self/status") as status:
        return {name: int(kib) * 1024 for name, kib in _KIB.findall(status.read())}


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # peak RSS := current RSS (Linux 4.0+)


def _summary(value: Any) -> dict[str, Any]:
    """What a test checks of a decoded value: its type and how many bytes it holds (cells of a frame too)."""
    kind = type(value).__name__
    if kind == "DataFrame":
        cells = [len(v) for column in value.columns for v in value[column] if isinstance(v, (bytes, str))]
        return {"type": kind, "cells": cells[:100], "held": int(value.memory_usage(deep=True).sum())}
    if hasattr(value, "nbytes"):
        return {"type": kind, "held": int(value.nbytes)}
    if hasattr(value, "element_size"):
        return {"type": kind, "held": int(value.element_size() * value.numel())}
    if isinstance(value, (bytes, bytearray, str)):
        return {"type": kind, "held": len(value)}
    if isinstance(value, dict):
        parts = [_summary(v) for v in value.values()]
        return {"type": kind, "held": sum(p["held"] for p in parts)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return {"type": kind, "held": sum(_summary(v)["held"] for v in value)}
    return {"type": kind, "held": 8}


def _container(data: bytes) -> dict[str, Any]:
    from gpu_offload.engine.trust.decode import SafeDecodeError, decode

    try:
        decoded = decode(data)
    except SafeDecodeError as exc:
        return {"refused": str(exc)}
    return {"values": {name: _summary(v) for name, v in decoded.values.items()},
            "skipped": [[s.name, s.reason] for s in decoded.skipped]}


_NONCE = "0123456789abcdef0123456789abcdef"


def _frames(data: bytes) -> dict[str, Any]:
    from gpu_offload.runner.frames import FrameDecoder

    decoder = FrameDecoder(_NONCE, max_event_bytes=1 << 20)
    events = decoder.feed(data) + decoder.close()
    return {"events": [type(event).__name__ for event in events][:200]}


def _sanitiser(name: str) -> Callable[[bytes], dict[str, Any]]:
    def run(data: bytes) -> dict[str, Any]:
        from gpu_offload.engine.trust import rich

        shown = rich.safe_display({name: data.decode("utf-8", "replace")}, {})
        return {"shown": shown.data, "dropped": list(shown.dropped)}

    return run


DECODERS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "container": _container, "frames": _frames, "text/html": _sanitiser("text/html"),
    "image/svg+xml": _sanitiser("image/svg+xml"), "text/markdown": _sanitiser("text/markdown"),
}


def _read(stream: Any, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError
    return bytes(data)


def main() -> int:
    # what the kernel has loaded before any output arrives: the libraries, not what decoding allocates
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    import torch  # noqa: F401

    from gpu_offload.engine.trust import decode, rich  # noqa: F401

    source, sink = sys.stdin.buffer, sys.stdout
    while True:
        try:
            kind_size, data_size = struct.unpack("<II", _read(source, 8))
            kind, data = _read(source, kind_size).decode(), _read(source, data_size)
        except EOFError:
            return 0
        _reset_peak()
        before = _memory()["VmRSS"]
        start = time.perf_counter()
        try:
            result = DECODERS[kind](data)
        except Exception as exc:  # noqa: BLE001 - the test decides; report what escaped the decoder
            result = {"raised": f"{type(exc).__name__}: {exc}"[:2000]}
        result["seconds"] = time.perf_counter() - start
        result["peak_growth"] = max(0, _memory()["VmHWM"] - before)
        sink.write(json.dumps(result, default=str) + "\n")
        sink.flush()


if __name__ == "__main__":
    sys.exit(main())
