"""The safe output format: values of a fixed list of types, written so that reading them runs no code.

An untrusted donor cluster must not be able to run code in the user's kernel, so what comes back from it
cannot be a pickle. The runner writes the cell's outputs as one *container*: a JSON manifest describing
each value as a tree of typed nodes, followed by binary blobs in formats that have loaders which never
execute code (``.npy`` without object dtype, safetensors or a ``torch.save`` tensor dict read back with
``weights_only=True``, Arrow IPC for DataFrames). The kernel reads it with :mod:`gpu_offload.engine.trust.
decode`; the runner only meets numpy, torch or pandas values when the cell imported them, so this module
looks them up in ``sys.modules`` and imports nothing of theirs itself.

Container: ``MAGIC``, the manifest's length (8 bytes little-endian), the manifest (UTF-8 JSON), then the
blobs back to back; the manifest says where each blob starts and ends, relative to the first blob.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"GPUOSAFE1\n"
VERSION = 1
MAX_DEPTH = 32
"""Deepest nesting of containers (lists, dicts, ...) in one value; the reader refuses deeper ones."""
MAX_NODES = 1_000_000
"""Most typed nodes in one container; a list of a million floats should travel as an array."""
ALLOWED = (
    "None, bool, int, float, complex, str, bytes, bytearray, lists, tuples, sets, frozensets and dicts of "
    "those, numpy arrays and scalars (no object dtype), torch tensors and state dicts, pandas DataFrames"
)


class NotEncodable(TypeError):
    """A value (or something inside it) is not one of the types the safe format carries."""


@dataclass(frozen=True)
class Skipped:
    """An output left out: its name, its type and why."""

    name: str
    type: str
    reason: str


@dataclass
class Encoded:
    """A container as the segments to write one after another (large arrays are not copied to build it)."""

    parts: list[Any]
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(memoryview(part).nbytes for part in self.parts)

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


def type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def float_bits(value: float) -> str:
    """A float as the hex of its IEEE bytes: bit-exact, NaN payloads and the sign of zero included."""
    return struct.pack("<d", value).hex()


class _Writer:
    def __init__(self) -> None:
        self.blobs: list[Any] = []
        self.offset = 0
        self.spans: list[list[int]] = []
        self.nodes = 0

    def blob(self, parts: list[Any]) -> int:
        size = sum(memoryview(part).nbytes for part in parts)
        self.spans.append([self.offset, self.offset + size])
        self.offset += size
        self.blobs.extend(parts)
        return len(self.spans) - 1

    def node(self, value: Any, depth: int) -> dict[str, Any]:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise NotEncodable(f"more than {MAX_NODES} values inside; convert large collections to arrays")
        kind = type(value)
        if value is None:
            return {"t": "none"}
        if kind is bool:
            return {"t": "bool", "v": value}
        if kind is int:
            return {"t": "int", "v": hex(value)}  # hex: str() refuses ints over 4300 digits
        if kind is float:
            return {"t": "float", "v": float_bits(value)}
        if kind is complex:
            return {"t": "complex", "v": [float_bits(value.real), float_bits(value.imag)]}
        if kind is str:
            return {"t": "str", "v": value}
        if kind in (bytes, bytearray):
            return {"t": kind.__name__, "b": self.blob([value])}
        if kind in _CONTAINERS:
            return self._container(value, depth)
        library = _library_node(self, value)
        if library is not None:
            return library
        raise NotEncodable(f"{type_name(value)} is not one of the types that can come back safely")

    def _container(self, value: Any, depth: int) -> dict[str, Any]:
        if depth >= MAX_DEPTH:
            raise NotEncodable(f"nested deeper than {MAX_DEPTH} levels")
        tag = _CONTAINERS[type(value)]
        if tag in ("dict", "odict"):
            if _is_state_dict(value):
                return {"t": tag, "tensors": self.blob(_tensor_dict_blob(value))}
            items = [[self.node(k, depth + 1), self.node(v, depth + 1)] for k, v in value.items()]
            return {"t": tag, "items": items}
        return {"t": tag, "items": [self.node(item, depth + 1) for item in value]}


_CONTAINERS: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset", dict: "dict",
               OrderedDict: "odict"}


def _library_node(writer: _Writer, value: Any) -> dict[str, Any] | None:
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        if type(value) is not numpy.ndarray and not isinstance(value, numpy.generic):
            raise NotEncodable(f"{type_name(value)} is an ndarray subclass; pass np.asarray(value)")
        array = numpy.asarray(value)
        tag = "ndarray" if isinstance(value, numpy.ndarray) else "npscalar"
        return {"t": tag, "b": writer.blob(npy_parts(array))}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise NotEncodable(f"{type_name(value)} is a tensor subclass; pass value.as_subclass(torch.Tensor)")
        node = {"t": "tensor", "b": writer.blob(_tensor_dict_blob({"t": value})), "rg": value.requires_grad}
        if type(value) is torch.nn.Parameter:
            node["t"] = "parameter"
        return node
    pandas = sys.modules.get("pandas")
    if pandas is not None and type(value) is pandas.DataFrame:
        return {"t": "dataframe", "b": writer.blob([_arrow_ipc(value)])}
    return None


def npy_parts(array: Any) -> list[Any]:
    """``.npy`` bytes of ``array`` as [header, data]: a C- or Fortran-contiguous array's memory is not copied."""
    numpy = sys.modules["numpy"]
    if array.dtype.hasobject:
        raise NotEncodable(f"a numpy array of dtype {array.dtype} holds Python objects; convert it (e.g. "
                           "astype(str) or a numeric dtype)")
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        array = numpy.ascontiguousarray(array)
    header = io.BytesIO()
    fortran = array.flags.f_contiguous and not array.flags.c_contiguous
    numpy.lib.format.write_array_header_2_0(header, {
        "descr": numpy.lib.format.dtype_to_descr(array.dtype), "fortran_order": fortran, "shape": array.shape,
    })
    data = array.T if fortran else array
    return [header.getvalue(), memoryview(data.reshape(-1).view(numpy.uint8))]


def _is_state_dict(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return (torch is not None and bool(value)
            and all(type(k) is str and type(v) is torch.Tensor for k, v in value.items()))


def _tensor_dict_blob(tensors: Any) -> list[Any]:
    """safetensors when the image has it, else ``torch.save`` of a plain dict of CPU tensors."""
    torch = sys.modules["torch"]
    plain = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.is_sparse or tensor.is_quantized or tensor.layout != torch.strided:
            raise NotEncodable(f"tensor {key!r} is sparse or quantized; pass tensor.to_dense()")
        plain[key] = tensor.as_subclass(torch.Tensor)
    try:
        from safetensors.torch import save
    except ImportError:
        buffer = io.BytesIO()
        # a tensor keeps its whole storage; torch.save would write all of a slice's base: clone views
        torch.save({k: (t.clone() if _is_view(t) else t) for k, t in plain.items()}, buffer)
        return [b"T", buffer.getbuffer()]
    return [b"S", save({k: t.contiguous() for k, t in plain.items()})]


def _is_view(tensor: Any) -> bool:
    return tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()


def _arrow_ipc(frame: Any) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise NotEncodable("a DataFrame travels as Arrow, and pyarrow is not installed where the cell ran; "
                           "install pyarrow in the image or convert it (df.to_dict('list'))") from None
    try:
        table = pyarrow.Table.from_pandas(frame, preserve_index=True)
    except (pyarrow.ArrowException, TypeError, ValueError) as exc:
        raise NotEncodable(f"its columns do not convert to Arrow ({exc}); give them plain dtypes") from None
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return memoryview(sink.getvalue())


def encode(values: dict[str, Any]) -> Encoded:
    """Encode each of ``values``; a name that is not encodable is left out and listed in ``skipped``."""
    writer = _Writer()
    names: dict[str, Any] = {}
    skipped: list[Skipped] = []
    for name, value in values.items():
        mark = (len(writer.spans), writer.offset, len(writer.blobs), writer.nodes)
        try:
            names[name] = writer.node(value, 0)
        except Exception as exc:  # noqa: BLE001 - one value that will not encode must not cost the others
            # forget the blobs this value already wrote
            writer.spans, writer.offset = writer.spans[: mark[0]], mark[1]
            writer.blobs, writer.nodes = writer.blobs[: mark[2]], mark[3]
            skipped.append(Skipped(name, type_name(value), str(exc)))
    manifest = {"version": VERSION, "names": names, "blobs": writer.spans,
                "skipped": [[s.name, s.type, s.reason] for s in skipped]}
    text = json.dumps(manifest, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    head = MAGIC + len(text).to_bytes(8, "little") + text
    return Encoded([head, *writer.blobs], skipped)
