"""A donor's container cannot make the kernel allocate more than a stated multiple of what it sent: a blob
named by many values is not copied for each, and the peak memory of the decode stays within
32 times the container plus 16 MiB (measured in a child process)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest

from .isolated import DecodeChild
from .test_safe_codec_attacks import container

BLOB = 100 << 10
REFERENCES = 1300
EXPANSION, EXPANSION_SLACK = 32, 16 << 20
"""The bound docs/security.md states: what decoding may add to the kernel's memory, per byte sent, plus a
constant (decode.EXPANSION, decode.EXPANSION_SLACK)."""


def _npy(size: int) -> bytes:
    out = io.BytesIO()
    np.save(out, np.zeros(size, dtype=np.uint8))
    return out.getvalue()


@pytest.fixture(scope="module")
def decode_child() -> Iterator[DecodeChild]:
    with DecodeChild() as process:
        yield process


@pytest.mark.parametrize("tag, blob", [("bytes", b"\0" * BLOB), ("ndarray", _npy(BLOB))])
def test_one_blob_named_by_many_values_is_read_once(decode_child: DecodeChild, tag: str, blob: bytes) -> None:
    data = container({"x": {"t": "list", "items": [{"t": tag, "b": 0}] * REFERENCES}}, [blob])
    result = decode_child.decode("container", data)
    bound = EXPANSION * len(data) + EXPANSION_SLACK
    assert result["peak_growth"] <= bound, (
        f"decoding {len(data)} bytes raised the kernel's memory by {result['peak_growth']} bytes (bound {bound})")
    assert "x" not in result.get("values", {}), f"{result['values']['x']['held']} bytes came back"
    [(name, reason)] = result["skipped"]
    assert name == "x" and "blob 0, which another value already read" in reason


def test_each_value_still_reads_its_own_blob(decode_child: DecodeChild) -> None:
    data = container({"x": {"t": "list", "items": [{"t": "bytes", "b": i} for i in range(3)]}}, [b"a", b"b", b"c"])
    assert decode_child.decode("container", data)["values"]["x"] == {"type": "list", "held": 3}
