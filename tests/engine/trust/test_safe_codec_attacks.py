"""A donor that crafts the outputs runs nothing in the kernel and gets a clear error or warning."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpu_offload.engine.trust.decode import SafeDecodeError, decode, skipped_warning
from gpu_offload.runner.safe import MAGIC, encode


class Payload:
    """Unpickling it creates the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (str(self.marker), "w"))


def container(names: dict[str, Any], blobs: list[bytes]) -> bytes:
    spans, offset = [], 0
    for blob in blobs:
        spans.append([offset, offset + len(blob)])
        offset += len(blob)
    text = json.dumps({"version": 1, "names": names, "blobs": spans, "skipped": []}).encode()
    return MAGIC + len(text).to_bytes(8, "little") + text + b"".join(blobs)


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


def test_a_pickle_instead_of_the_container_is_refused_unread(marker: Path) -> None:
    with pytest.raises(SafeDecodeError, match="not in the safe format"):
        decode(pickle.dumps({"x": Payload(marker)}))
    assert not marker.exists()


def test_an_npy_with_object_dtype_runs_nothing(marker: Path) -> None:
    npy = io.BytesIO()
    np.save(npy, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    decoded = decode(container({"x": {"t": "ndarray", "b": 0}}, [npy.getvalue()]))
    assert decoded.values == {} and [s.name for s in decoded.skipped] == ["x"]
    assert "allow_pickle" in decoded.skipped[0].reason
    assert not marker.exists()


@pytest.mark.parametrize("legacy", [False, True])
def test_a_torch_file_with_a_pickled_callable_runs_nothing(marker: Path, legacy: bool) -> None:
    data = io.BytesIO()
    torch.save({"t": Payload(marker)}, data, _use_new_zipfile_serialization=not legacy)
    for tag in ("tensor", "state"):
        node = {"t": "tensor", "b": 0} if tag == "tensor" else {"t": "dict", "tensors": 0}
        decoded = decode(container({"x": node}, [b"T" + data.getvalue()]))
        assert decoded.values == {} and decoded.skipped[0].name == "x"
        # the legacy format is no archive at all: refused before torch reads it
        expected = "not a torch archive" if legacy else "weights_only=True) refuses"
        assert expected in decoded.skipped[0].reason
    assert not marker.exists()


def test_a_dataframe_tag_over_a_pickle_runs_nothing(marker: Path) -> None:
    pytest.importorskip("pyarrow")
    decoded = decode(container({"x": {"t": "dataframe", "b": 0}}, [pickle.dumps(Payload(marker))]))
    assert decoded.values == {} and "does not load safely" in decoded.skipped[0].reason
    assert not marker.exists()


@pytest.mark.parametrize("names, blobs, expected", [
    ({"x": {"t": "bytes", "b": 0}}, [b"abc"], None),  # valid: the control case
    ({"x": {"t": "module", "v": "os"}}, [], "not one this kernel loads"),
    ({"x": {"t": "dict", "items": [[{"t": "list", "items": []}, {"t": "none"}]]}}, [], "unhashable"),
    ({"x": {"t": "float", "v": "zz"}}, [], "not 16 hex digits"),
    ({"x": {"t": "int", "v": "f" * (2 << 20)}}, [], "reasonable length"),
    ({"x": {"t": "bytes", "b": 7}}, [], "does not exist"),
    ({"x": "garbage"}, [], "malformed"),
])
def test_malformed_values_are_skipped_with_a_reason(names: dict, blobs: list, expected: str | None) -> None:
    decoded = decode(container(names, blobs))
    if expected is None:
        assert decoded.values == {"x": b"abc"}
    else:
        assert decoded.values == {} and expected in decoded.skipped[0].reason


def test_nesting_beyond_the_bound_is_skipped_and_absurd_nesting_is_refused() -> None:
    node: dict[str, Any] = {"t": "none"}
    for _ in range(40):
        node = {"t": "list", "items": [node]}
    decoded = decode(container({"x": node}, []))
    assert decoded.values == {} and "nested deeper" in decoded.skipped[0].reason
    text = b'{"version":1,"names":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"},\"blobs\":[]}"
    with pytest.raises(SafeDecodeError, match="not JSON"):
        decode(MAGIC + len(text).to_bytes(8, "little") + text)


@pytest.mark.parametrize("spans", [[[0, 10]], [[-1, 2]], [[3, 2]], ["x"], [[0, 1.5]]])
def test_blobs_outside_the_data_are_refused(spans: list) -> None:
    text = json.dumps({"version": 1, "names": {}, "blobs": spans}).encode()
    with pytest.raises(SafeDecodeError, match="outside the data"):
        decode(MAGIC + len(text).to_bytes(8, "little") + text + b"abc")


def test_a_manifest_longer_than_the_data_is_refused() -> None:
    with pytest.raises(SafeDecodeError, match="more than the data holds"):
        decode(MAGIC + (1 << 40).to_bytes(8, "little") + b"{}")


def test_corrupted_containers_only_ever_raise_the_decode_error(marker: Path) -> None:
    good = encode({
        "a": np.arange(20, dtype=np.float16).reshape(4, 5), "t": torch.ones(3, dtype=torch.bfloat16),
        "s": {"k": [1, 2.5, "x", b"y"]}, "state": {"w": torch.zeros(2)},
    }).tobytes()
    rng = random.Random(13)
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        with contextlib.suppress(SafeDecodeError):  # anything else fails the test
            decode(bytes(data))
    assert not marker.exists()


@pytest.mark.parametrize("shape", [(10**12,), (3,), (2, 2, 2)])
def test_an_array_whose_shape_does_not_match_its_data_is_refused_without_allocating(shape: tuple) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    blob = header.getvalue() + np.arange(4, dtype="<f8").tobytes()
    decoded = decode(container({"x": {"t": "ndarray", "b": 0}}, [blob]))
    assert decoded.values == {} and "needs" in decoded.skipped[0].reason


def test_keys_crafted_to_share_a_hash_are_refused_and_ordinary_ones_pass() -> None:
    modulus = 2**61 - 1  # an int hashes to itself modulo this
    colliding = [{"t": "int", "v": hex(k * modulus)} for k in range(1, 3001)]
    ordinary = [{"t": "int", "v": hex(k)} for k in range(3000)]
    decoded = decode(container({
        "s": {"t": "set", "items": colliding},
        "d": {"t": "dict", "items": [[key, {"t": "none"}] for key in colliding]},
        "ok": {"t": "frozenset", "items": ordinary},
    }, []))
    assert decoded.values == {"ok": frozenset(range(3000))}
    assert all("share a hash" in skip.reason for skip in decoded.skipped)


def test_a_compressed_torch_archive_is_refused_before_torch_inflates_it(tmp_path: Path) -> None:
    import zipfile

    stored = io.BytesIO()
    torch.save({"t": torch.zeros(4)}, stored)
    deflated = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(stored.getvalue())) as source, \
            zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            target.writestr(member.filename, source.read(member))
    decoded = decode(container({"x": {"t": "tensor", "b": 0}}, [b"T" + deflated.getvalue()]))
    assert decoded.values == {} and "compressed" in decoded.skipped[0].reason


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_arrow_data_is_refused_before_it_inflates(compression: str) -> None:
    pandas = pytest.importorskip("pandas")
    pyarrow = pytest.importorskip("pyarrow")
    frame = pandas.DataFrame({"c": pandas.Categorical(["x", "y"] * 500), "n": range(1000)})
    table = pyarrow.Table.from_pandas(frame)
    sink = pyarrow.BufferOutputStream()
    options = pyarrow.ipc.IpcWriteOptions(compression=compression)
    with pyarrow.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    decoded = decode(container({"x": {"t": "dataframe", "b": 0}}, [sink.getvalue().to_pybytes()]))
    assert decoded.values == {} and "compressed" in decoded.skipped[0].reason


def test_a_type_name_the_donor_forged_is_shown_on_one_printable_line() -> None:
    tag = "evil\x1b[2J\nforged line " + "z" * 400
    decoded = decode(container({"x": {"t": tag, "b": 0}}, [b"abc"]))
    (skip,) = decoded.skipped
    assert skip.type.startswith("evil [2J forged line z") and skip.type.endswith("...")
    assert all(c.isprintable() for c in skipped_warning(skip)) and len(skip.type) == 303
