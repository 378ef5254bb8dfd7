"""Outputs from an untrusted cluster come back bit-exact for every type the safe format carries."""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch

from gpu_offload.engine.trust.decode import Decoded, decode, skipped_warning
from gpu_offload.runner.safe import encode


def round_trip(values: dict[str, Any]) -> Decoded:
    encoded = encode(values)
    assert encoded.skipped == []
    data = encoded.tobytes()
    assert len(data) == encoded.size
    return decode(data, wanted=set(values))


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down; floats compared by their bits."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


NAN_WITH_PAYLOAD = struct.unpack("<d", bytes.fromhex("0100000000f8ff7f"))[0]
PLAIN = {
    "none": None,
    "flags": [True, False],
    "ints": (0, -1, 2**200, -(2**20000)),  # beyond the 4300 digits str() allows
    "floats": [1.5, -0.0, math.inf, -math.inf, NAN_WITH_PAYLOAD, 5e-324],
    "complex": complex(NAN_WITH_PAYLOAD, -0.0),
    "text": "héllo \x00 \ud800 \u2028",
    "raw": b"\x00\xff" * 10,
    "mutable_raw": bytearray(b"abc"),
    "nested": {"a": [1, (2.0, {"deep": {3, 4}})], (1, "k"): frozenset({b"x"}), None: {}},
    "ordered": OrderedDict([("z", 1), ("a", 2)]),
}


def test_plain_values_come_back_with_their_types_and_bits() -> None:
    decoded = round_trip(PLAIN)
    assert decoded.skipped == ()
    for name, value in PLAIN.items():
        assert same(decoded.values[name], value), name


@pytest.mark.parametrize("dtype", [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "longdouble", "complex64", "complex128",
    "datetime64[ns]", "timedelta64[s]", "U7", "S3", [("x", "<i4"), ("y", "<f2")],
])
def test_arrays_of_every_dtype_come_back_bit_exact(dtype: Any) -> None:
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, size=6 * 5 * np.dtype(dtype).itemsize, dtype=np.uint8)
    array = raw.view(dtype).reshape(6, 5)
    views = {"whole": array, "strided": array[::2, ::-2], "fortran": np.asfortranarray(array),
             "zero_d": array[1, 1, ...], "empty": array[:0]}
    decoded = round_trip(views)
    for name, value in views.items():
        back = decoded.values[name]
        assert type(back) is np.ndarray, name
        assert (back.dtype, back.shape) == (value.dtype, value.shape), name
        assert back.tobytes() == value.tobytes(), name
        assert back.flags.writeable
    assert decoded.values["fortran"].flags.f_contiguous


def test_numpy_scalars_come_back_as_numpy_scalars() -> None:
    values = {"f16": np.float16(1.5), "f64": np.float64(-0.0), "i": np.int8(-3), "b": np.bool_(True)}
    decoded = round_trip(values)
    for name, value in values.items():
        back = decoded.values[name]
        assert type(back) is type(value) and back.tobytes() == value.tobytes(), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
                                   torch.complex64, torch.uint8, torch.float64])
def test_tensors_come_back_bit_exact(dtype: torch.dtype) -> None:
    base = torch.arange(60, dtype=torch.float64).reshape(6, 10).sin().mul(100).to(dtype)
    values = {"t": base, "view": base[::2, 3:], "scalar": base[0, 0]}
    encoded = encode(values).tobytes()
    # a view travels as itself, not with the whole storage it looks into
    big = torch.zeros(100_000, dtype=dtype)
    assert encode({"view": big[:10]}).size < encode({"big": big}).size / 10
    decoded = decode(encoded)
    for name, value in values.items():
        back = decoded.values[name]
        assert type(back) is torch.Tensor and back.dtype == value.dtype and back.shape == value.shape
        assert back.reshape(-1).view(torch.uint8).equal(value.reshape(-1).view(torch.uint8)), name


def test_state_dicts_and_parameters_come_back() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(torch.bfloat16)
    state = model.state_dict()
    weight = torch.nn.Parameter(torch.ones(2, 2), requires_grad=False)
    decoded = round_trip({"state": state, "plain": dict(state), "weight": weight})
    back = decoded.values["state"]
    assert type(back) is OrderedDict and list(back) == list(state)
    assert all(back[k].dtype == v.dtype and back[k].equal(v) for k, v in state.items())
    assert type(decoded.values["plain"]) is dict and list(decoded.values["plain"]) == list(state)
    assert type(decoded.values["weight"]) is torch.nn.Parameter
    assert decoded.values["weight"].requires_grad is False and decoded.values["weight"].equal(weight)
    tracked = round_trip({"t": torch.ones(3, requires_grad=True), "u": torch.ones(3)}).values
    assert tracked["t"].requires_grad is True and tracked["u"].requires_grad is False
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(torch.bfloat16)
    fresh.load_state_dict(back)


def test_dataframes_with_an_index_come_back_exactly() -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    index = pandas.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)], names=["group", "n"])
    frame = pandas.DataFrame({
        "x": np.array([1.5, np.nan, -0.0]),
        "half": np.array([1, 2, 3], dtype="float16"),
        "flag": [True, False, True],
        "when": pandas.to_datetime(["2024-01-01", "2024-06-30", "2025-12-31"]).tz_localize("UTC"),
        "label": pandas.Categorical(["u", "v", "u"]),
        "text": ["é", "", "z"],
    }, index=index)
    named = pandas.DataFrame({"v": [3, 1]}, index=pandas.Index([10, 20], name="step"))
    decoded = round_trip({"frame": frame, "named": named})
    pandas.testing.assert_frame_equal(decoded.values["frame"], frame, check_exact=True)
    pandas.testing.assert_frame_equal(decoded.values["named"], named, check_exact=True)
    assert decoded.values["frame"]["x"].to_numpy().tobytes() == frame["x"].to_numpy().tobytes()


class Model:
    pass


def test_a_value_that_cannot_come_back_is_named_with_its_type_and_the_way_out() -> None:
    values = {"ok": 1, "model": Model(), "fn": lambda: 1, "objects": np.array([1, "a"], dtype=object),
              "inside": [1, {"k": Model()}]}
    encoded = encode(values)
    assert [(s.name, s.type) for s in encoded.skipped] == [
        ("model", f"{__name__}.Model"), ("fn", "function"), ("objects", "numpy.ndarray"), ("inside", "list")]
    assert "holds Python objects" in encoded.skipped[2].reason
    decoded = decode(encoded.tobytes(), wanted={"ok", "model", "fn", "objects", "inside"})
    assert decoded.values == {"ok": 1}
    assert "holds Python objects" in decoded.skipped[2].reason  # the runner's reason, shown as text
    warning = skipped_warning(decoded.skipped[0])
    assert "`model`" in warning and f"{__name__}.Model" in warning and "trusted cluster" in warning
    assert "Convert it" in warning


def test_names_nobody_asked_for_are_not_loaded() -> None:
    decoded = decode(encode({"x": 1, "__builtins__": 2, "y": Model()}).tobytes(), wanted={"x"})
    assert decoded.values == {"x": 1} and decoded.skipped == ()


@pytest.mark.e2e  # starts a process
def test_the_encoder_runs_inside_the_runner_archive_with_the_standard_library_only(tmp_path) -> None:
    import subprocess
    import sys

    from gpu_offload.runner.build import build_runner

    pyz = build_runner(tmp_path)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from gpo_runner.safe import encode\n"
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
        "import numpy\n"
        "sys.stdout.buffer.write(encode({'a': numpy.arange(3), 'b': [1, 'x']}).tobytes())\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", script, str(pyz)], capture_output=True, check=True)
    decoded = decode(out.stdout)
    assert decoded.values["b"] == [1, "x"] and decoded.values["a"].tolist() == [0, 1, 2]
