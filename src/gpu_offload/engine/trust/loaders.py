"""The safe loaders behind :mod:`.decode`: one blob in, one value out, no code run.

``.npy`` through numpy's header parser (``ast.literal_eval`` with numpy's size limit) and no object dtype;
tensors through safetensors or ``torch.load(weights_only=True)`` of an uncompressed archive; DataFrames
through Arrow IPC. Each raises :class:`Refused` with the reason, or whatever the library raises on bytes it
cannot parse (the caller turns both into a skipped value).
"""

from __future__ import annotations

import io
import pickle  # for its exception type only: nothing here unpickles
import struct
import warnings
import zipfile
from collections.abc import Callable
from typing import IO, Any, cast

from ...liqo_peering.untrusted_text import shown

NPY_MAX_HEADER = 10000
"""numpy's own default limit on an .npy header."""


class Refused(Exception):
    """One value cannot come back; the message says why."""


class _MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a memoryview (``io.BytesIO`` would copy a gigabyte to start)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos : self._pos + len(memoryview(buffer).cast("B"))]
        memoryview(buffer).cast("B")[: chunk.nbytes] = chunk
        self._pos += chunk.nbytes
        return chunk.nbytes


def _check_stored_archive(body: memoryview) -> None:
    """A torch archive whose members are stored, not compressed, and fit in the data: a deflated member
    could expand a few kilobytes from the donor into all of the kernel's memory."""
    try:
        members = zipfile.ZipFile(_MemoryFile(body)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise Refused(f"its tensor data is not a torch archive ({exc})") from None
    for member in members:
        if member.compress_type != zipfile.ZIP_STORED or member.file_size > body.nbytes:
            raise Refused(f"its tensor archive member {member.filename[:80]!r} is compressed or larger "
                          "than the data; torch.save writes neither")


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise Refused("numpy is not installed in this kernel; install it to receive arrays") from None
    return numpy


Charge = Callable[[int], None]
"""Counts bytes a loader is about to allocate against the run's budget (raises when it is spent)."""


def _load_npy(data: memoryview, tag: str, charge: Charge) -> Any:
    """An ``.npy`` blob read as ``np.load(allow_pickle=False)`` reads it (numpy's own header parser, with
    its header size limit), but with one copy out of the blob instead of three."""
    numpy = _numpy()
    fmt = numpy.lib.format
    head = io.BytesIO(data[: min(data.nbytes, 12 + NPY_MAX_HEADER)])
    version = fmt.read_magic(head)
    readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    if version not in readers:
        raise Refused(f".npy version {version} is not one this kernel reads (1.0 or 2.0)")
    shape, fortran, dtype = readers[version](head, max_header_size=NPY_MAX_HEADER)
    if dtype.hasobject:
        raise Refused(f"its array has dtype {dtype}, which holds pickled Python objects that "
                       "np.load(allow_pickle=False) refuses")
    count = 1
    for extent in shape:
        count *= extent
    body = data[head.tell():]
    if body.nbytes != count * dtype.itemsize:
        raise Refused(f"its array data is {body.nbytes} bytes where shape {shape} needs "
                       f"{count * dtype.itemsize}")
    # copied as bytes, then viewed as the dtype: the blob's offset in the container may leave elements
    # unaligned, and numpy copies those one by one (7x slower); a bytearray rather than a numpy copy,
    # whose hugepage advice stalls in memory compaction where defrag is "madvise" (2x the wall time)
    raw = bytearray(body)
    flat = numpy.frombuffer(raw, dtype=dtype) if dtype.itemsize else numpy.ndarray(count, dtype)
    array = flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
    return array[()] if tag == "npscalar" else array


def load_tensors(data: memoryview, charge: Charge) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        raise Refused("torch is not installed in this kernel; install it to receive tensors") from None
    if _version(torch.__version__) < (2, 6):
        # weights_only=True could be bypassed before 2.6 (CVE-2025-32434)
        raise Refused(f"torch {torch.__version__} in this kernel cannot load tensors safely; install "
                       "torch 2.6 or later")
    kind, body = bytes(data[:1]), data[1:]
    charge(body.nbytes)  # the tensors, beside the blob (safetensors also copies the blob: transient)
    if kind == b"S":
        try:
            from safetensors.torch import load
        except ImportError:
            raise Refused("it was written with safetensors, which this kernel lacks; install "
                           "safetensors") from None
        tensors = load(bytes(body))
    elif kind == b"T":
        try:
            _check_stored_archive(body)
            source = cast(IO[bytes], _MemoryFile(body))  # a RawIOBase: read, seek and tell are all torch uses
            with warnings.catch_warnings():  # torch's advice about odd pickle protocols is not the user's
                warnings.simplefilter("ignore")
                tensors = torch.load(source, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError:
            raise Refused("its tensor data holds Python objects besides tensors, which "
                           "torch.load(weights_only=True) refuses") from None
    else:
        raise Refused("its tensor data is in no format this kernel knows")
    if not isinstance(tensors, dict) or not all(
        type(k) is str and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise Refused("its tensor data is not a dict of tensors")
    return dict(tensors)


def _load_tensor(data: memoryview, tag: str, charge: Charge) -> Any:
    tensors = load_tensors(data, charge)
    if set(tensors) != {"t"}:
        raise Refused("its tensor data is not one tensor")
    return tensors["t"]


def _load_frame(data: memoryview, tag: str, charge: Charge) -> Any:
    try:
        import pandas  # noqa: F401 - to_pandas needs it; say so before pyarrow does
        import pyarrow
    except ImportError:
        raise Refused("pandas and pyarrow are needed in this kernel to receive DataFrames") from None
    if _version(pyarrow.__version__) < (14, 0, 1):
        # earlier pyarrow unpickles the extension types named in the data (CVE-2023-47248)
        raise Refused(f"pyarrow {pyarrow.__version__} in this kernel cannot read Arrow data safely; "
                       "install pyarrow 14.0.1 or later")
    buffer = pyarrow.py_buffer(data)
    for message in pyarrow.ipc.MessageReader.open_stream(buffer):
        if _compressed_batch(message.metadata.to_pybytes()):
            raise Refused("its Arrow data is compressed (a few kilobytes could inflate into all of the "
                          "kernel's memory); the runner writes it uncompressed")
    table = pyarrow.ipc.open_stream(buffer).read_all()
    try:
        # reading checks only each buffer's size: a binary offset or a view pointing past its data would
        # make to_pandas copy the kernel's own memory into the frame (or crash it); full validation checks
        # every offset, view and dictionary index against the data
        table.validate(full=True)
    except pyarrow.ArrowException as exc:
        raise Refused(f"its Arrow data is invalid ({shown(exc, 200)}); it would read outside its own "
                      "data, so it is refused") from None
    charge(_pandas_bytes(pyarrow, table))
    return table.to_pandas()


def _pandas_bytes(pyarrow: Any, table: Any) -> int:
    """About what ``to_pandas`` allocates for ``table``: 8 bytes a cell (the widest numpy scalar, or an
    object pointer) and, for what becomes Python objects, an object per cell and its data."""
    types = pyarrow.types
    total = 0
    for column in table.columns:
        kind, rows = column.type, len(column)
        if types.is_boolean(kind) and not column.null_count:
            total += rows
        elif types.is_primitive(kind) or types.is_dictionary(kind):
            total += 8 * rows
        else:  # strings, bytes, nested values, decimals: Python objects
            total += (8 + 112) * rows + column.nbytes
    return total


def _flat_table(buf: bytes, pos: int) -> Callable[[int], int]:
    """Field offsets of the flatbuffer table at ``pos`` (0: absent); struct.error when out of bounds."""
    vtable = pos - struct.unpack_from("<i", buf, pos)[0]
    vsize = struct.unpack_from("<H", buf, vtable)[0]

    def field(index: int) -> int:
        at = vtable + 4 + 2 * index
        return int(struct.unpack_from("<H", buf, at)[0]) if at + 2 <= vtable + vsize else 0

    return field


def _compressed_batch(meta: bytes) -> bool:
    """Whether an Arrow IPC message (its flatbuffer metadata) is a record or dictionary batch with a
    ``compression`` field (Message: header_type 1, header 2; DictionaryBatch: data 1; RecordBatch:
    compression 3; MessageHeader: 2 DictionaryBatch, 3 RecordBatch)."""
    root = struct.unpack_from("<I", meta, 0)[0]
    message = _flat_table(meta, root)
    kind = meta[root + message(1)] if message(1) else 0
    if kind not in (2, 3) or not message(2):
        return False
    header = root + message(2) + struct.unpack_from("<I", meta, root + message(2))[0]
    if kind == 2:
        data = _flat_table(meta, header)(1)
        if not data:
            return False
        header = header + data + struct.unpack_from("<I", meta, header + data)[0]
    return _flat_table(meta, header)(3) != 0


def _version(text: str) -> tuple[int, ...]:
    numbers = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        numbers.append(int(digits[:6] or 0))
    return tuple(numbers)


LOADERS: dict[str, Callable[[memoryview, str, Charge], Any]] = {
    "ndarray": _load_npy, "npscalar": _load_npy, "tensor": _load_tensor, "parameter": _load_tensor,
    "dataframe": _load_frame,
}
