"""A donor's DataFrame whose Arrow buffers point outside its own data reads nothing of the kernel's memory and
crashes nothing: it is refused with the reason, in a child process so that a crash would fail the test."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pyarrow as pa
import pytest

from .isolated import DecodeChild
from .test_safe_codec_attacks import container


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _patched(ipc: bytes, old: bytes, new: bytes) -> bytes:
    assert ipc.count(old) == 1 and len(old) == len(new)
    return ipc.replace(old, new)


def view_past_its_buffer() -> bytes:
    """A binary-view cell of 3000 bytes over a 20-byte buffer: converting it copies 2980 bytes of the heap."""
    ipc = _ipc(pa.table({"x": pa.array([b"A" * 20], type=pa.binary_view())}))
    view = struct.pack("<i", 20) + b"AAAA" + struct.pack("<ii", 0, 0)  # length, prefix, buffer, offset
    return _patched(ipc, view, struct.pack("<i", 3000) + b"AAAA" + struct.pack("<ii", 0, 0))


def offsets_past_their_data() -> bytes:
    """A binary column whose middle offset lies past its 4 bytes of data (first and last are in bounds, which
    is all that reading the stream checks)."""
    offsets = struct.pack("<3i", 0, 1, 4)
    column = pa.Array.from_buffers(pa.binary(), 2, [None, pa.py_buffer(offsets), pa.py_buffer(b"ABCD")])
    return _patched(_ipc(pa.table({"x": column})), offsets, struct.pack("<3i", 0, 3000, 4))


def index_past_its_dictionary() -> bytes:
    """A dictionary-encoded column whose index names entry 32767 of a 300-entry dictionary."""
    indices = pa.array([257, 299], type=pa.int16())
    column = pa.DictionaryArray.from_arrays(indices, pa.array([b"%d" % i for i in range(300)]))
    return _patched(_ipc(pa.table({"x": column})), struct.pack("<2h", 257, 299), struct.pack("<2h", 257, 32767))


@pytest.fixture(scope="module")
def decode_child() -> Iterator[DecodeChild]:
    with DecodeChild() as process:
        yield process


@pytest.mark.parametrize("crafted", [view_past_its_buffer, offsets_past_their_data, index_past_its_dictionary])
def test_arrow_data_pointing_outside_itself_is_refused_not_read(decode_child: DecodeChild, crafted) -> None:
    result = decode_child.decode("container", container({"df": {"t": "dataframe", "b": 0}}, [crafted()]))
    leaked = result.get("values", {}).get("df")
    assert leaked is None, f"the donor's DataFrame came back holding kernel memory: cells of {leaked['cells']} bytes"
    [(name, reason)] = result["skipped"]
    assert name == "df" and "Arrow data is invalid" in reason and "refused" in reason


def test_a_valid_frame_still_comes_back(decode_child: DecodeChild) -> None:
    ipc = _ipc(pa.table({"x": pa.array([b"A" * 20, b"B"], type=pa.binary_view()), "n": [1, 2]}))
    result = decode_child.decode("container", container({"df": {"t": "dataframe", "b": 0}}, [ipc]))
    assert result["values"]["df"]["cells"] == [20, 1] and result["skipped"] == []
