"""Seeds and mutations for fuzzing the decoders: valid inputs made by the project's own writers (the runner's
safe encoder, Arrow, numpy, torch, the frame encoder), then bytes flipped, overwritten with boundary values,
cut, repeated or spliced with fragments an attacker would try. Everything is drawn from ``random.Random``
with a stated seed, so a failing case is rebuilt from its seed and index alone."""

from __future__ import annotations

import io
import json
import random
import struct
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from gpu_offload.runner.safe import MAGIC, encode
from gpu_offload.runner.wire import FrameEncoder

NONCE = "0123456789abcdef0123456789abcdef"
"""The nonce ``decode_child.py``'s frame decoder expects."""


def container(names: dict, blobs: list[bytes]) -> bytes:
    spans, offset = [], 0
    for blob in blobs:
        spans.append([offset, offset + len(blob)])
        offset += len(blob)
    text = json.dumps({"version": 1, "names": names, "blobs": spans, "skipped": []}).encode()
    return MAGIC + len(text).to_bytes(8, "little") + text + b"".join(blobs)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _torch(tensor: torch.Tensor) -> bytes:
    out = io.BytesIO()
    torch.save({"t": tensor}, out)
    return b"T" + out.getvalue()


def _safetensors(tensor: torch.Tensor) -> list[bytes]:
    try:
        from safetensors.torch import save
    except ImportError:  # not a dependency: the runner then writes torch.save archives
        return []
    return [b"S" + save({"t": tensor})]


def _frames() -> bytes:
    lines: list[bytes] = []
    encoder = FrameEncoder(NONCE, lines.append)
    encoder.emit("hello", python="3.11.7", pid=7, gpus=["A100"], session=False)
    encoder.begin_run("run-1")
    encoder.emit("stream", name="stdout", text="x" * 40 + "\n")
    encoder.emit("metrics", gpu=[{"index": 0, "name": "A100", "util": 5, "mem_used": 1, "mem_total": 2}])
    encoder.emit("display_data", data={"text/plain": "t", "text/html": "<b>b</b>"}, metadata={})
    encoder.emit("outputs", names=["y"], pickle="R1BVT1NBRkUx", buffers=[], format="safe")
    encoder.emit("done", status="ok", elapsed=0.5)
    return b"".join(lines)


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs per family, each small (a few KiB): mutations of them reach deep into the parsers. The
    blob families (npy, arrow, torch) hold the blob alone: :data:`WRAP` puts it in a container after it was
    mutated, so the edits land in the loader's input rather than in the manifest."""
    frame = pd.DataFrame({"s": ["a", "bc", None], "n": [1, 2, 3], "b": [True, None, False], "f": [0.5, 1.5, 2.5]})
    tables = [
        pa.Table.from_pandas(frame),
        pa.table({"v": pa.array([b"A" * 20, b"B"], type=pa.binary_view())}),
        pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int8()), pa.array(["x", "y"]))}),
        pa.table({"l": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64()))}),
        pa.table({"bin": pa.array([b"ab", b"", b"cdef"]), "ls": pa.array(["x", "yz", ""], pa.large_string())}),
    ]
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    values = {"i": 12, "s": "text", "b": b"bytes", "l": [1, 2.5, None, {"k": (1, 2)}], "a": np.arange(6)}
    return {
        "npy": [_npy(a) for a in (np.arange(12).reshape(3, 4), np.array([1.5], ">f8"), np.zeros((2, 2), dtype="U3"),
                                  np.asfortranarray(np.eye(3)))],
        "arrow": [_ipc(table) for table in tables],
        "torch": [_torch(tensor), *_safetensors(tensor)],
        "container": [encode(values).tobytes(), encode({"df": frame, "t": tensor}).tobytes()],
        "frames": [_frames()],
        "text/html": [b"<table border=1><tr><td><a href='https://example.org'>x</a></td></tr></table><b>b</b>"],
        "image/svg+xml": [b"<svg viewBox='0 0 10 10'><defs><path id='p' d='M0 0L1 1'/></defs>"
                          b"<use href='#p'/><text x='1'>t</text></svg>"],
        "text/markdown": [b"# T\n\n![i](https://e.example/p.png) [l](https://e.example)\n\n[r]: https://e.example"
                          b"\n\n> q\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n`c < d` **b** <i>i</i>\n"],
    }


WRAP: dict[str, Callable[[bytes], bytes]] = {
    "npy": lambda blob: container({"x": {"t": "ndarray", "b": 0}}, [blob]),
    "arrow": lambda blob: container({"x": {"t": "dataframe", "b": 0}}, [blob]),
    "torch": lambda blob: container({"x": {"t": "tensor", "b": 0}, "y": {"t": "dict", "tensors": 1}},
                                    [blob, blob]),
}
"""How a mutated blob travels: in a container, as the runner would send it (others travel as they are)."""

DECODER = {"npy": "container", "arrow": "container", "torch": "container", "container": "container",
           "frames": "frames", "text/html": "text/html", "image/svg+xml": "image/svg+xml",
           "text/markdown": "text/markdown"}
"""Which of ``decode_child``'s decoders takes each seed family."""

FRAGMENTS = [b"<script>alert(1)</script>", b"javascript:", b"<img src=https://e.example/p.png>", b"onerror=",
             b"![", b"](", b"]:", b"\n[r]: ", b"&#58;", b"\\", b"<", b">", b"\x00", b"\xff\xfe", b"\n\n",
             b"<svg onload=alert(1)>", b"url(https://e.example)", b"\x1egpuo ", b'{"', b"[[[[[[[[", b'"t":',
             b"\xe2\x80\xae", b"<a href=", b"data:text/html,", b"<!--", b"]]>"]
INTS = [0, 1, -1, 2**31 - 1, -(2**31), 2**16, 2**20, 2**32 - 1, 255, 4096]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four random edits of ``data``."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        _EDITS[rng.randrange(len(_EDITS))](out, rng)
    return bytes(out)


def _flip(out: bytearray, rng: random.Random) -> None:
    if out:
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)


def _byte(out: bytearray, rng: random.Random) -> None:
    if out:
        out[rng.randrange(len(out))] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])


def _int(out: bytearray, rng: random.Random) -> None:
    packed = struct.pack("<q", rng.choice(INTS))[: rng.choice([4, 8])]  # an offset, length or count field
    if len(out) >= len(packed):
        at = rng.randrange(len(out) - len(packed) + 1)
        out[at : at + len(packed)] = packed


def _cut(out: bytearray, rng: random.Random) -> None:
    if out:
        del out[rng.randrange(len(out)) :]


def _repeat(out: bytearray, rng: random.Random) -> None:
    if out:
        start = rng.randrange(len(out))
        chunk = out[start : start + rng.randint(1, 64)]
        at = rng.randrange(len(out))
        out[at:at] = chunk * rng.randint(1, 8)


def _delete(out: bytearray, rng: random.Random) -> None:
    if out:
        start = rng.randrange(len(out))
        del out[start : start + rng.randint(1, 32)]


def _splice(out: bytearray, rng: random.Random) -> None:
    at = rng.randrange(len(out) + 1)
    out[at:at] = rng.choice(FRAGMENTS)


_EDITS: list[Callable[[bytearray, random.Random], None]] = [_flip, _byte, _int, _cut, _repeat, _delete, _splice]
