"""Reading outputs from an untrusted cluster: only safe loaders, only a fixed list of types, never pickle.

The container comes from whoever runs the donor's pod, so every byte of it is treated as hostile: sizes
and offsets are checked against the data, nesting and node counts are bounded, arrays go through
``np.load(allow_pickle=False)``, tensors through safetensors or ``torch.load(weights_only=True)``, data
frames through Arrow IPC, fully validated (pyarrow no longer loads pickle-backed extension types). Each blob
is read by one value only, and every decoded byte is charged to one budget, :data:`EXPANSION` times the
container plus :data:`EXPANSION_SLACK`, before it is allocated. A malformed container
raises :class:`SafeDecodeError` and nothing else; a single value that cannot come back (a library missing
in the kernel, a refused dtype, bytes that do not parse) is left out with a :class:`Skipped` saying so.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ...liqo_peering.untrusted_text import shown
from ...runner.safe import ALLOWED, MAGIC, MAX_DEPTH, MAX_NODES, VERSION, Skipped
from .loaders import LOADERS, Refused, load_tensors

__all__ = ["Decoded", "SafeDecodeError", "Skipped", "decode", "skipped_warning"]

MAX_MANIFEST_BYTES = 256 << 20
MAX_TYPE_NAME = 300
"""Characters of a text the donor wrote (a type's name, why a value was left out) shown in a warning at most."""
MAX_HASH_COLLISIONS = 1000
EXPANSION = 32
"""What the values decoded from one container (one run's outputs) may take, as a multiple of the container's
bytes, plus :data:`EXPANSION_SLACK`. Numbers, arrays and tensors take about what they sent; what grows is
what becomes Python objects (a 1-byte string in Arrow is a 50-byte ``str``; a boolean with nulls, 2 bits in
Arrow, is an 8-byte pointer)."""
EXPANSION_SLACK = 16 << 20


class SafeDecodeError(ValueError):
    """The outputs container is malformed; nothing in it was loaded."""


class _OverBudget(Exception):
    """The values would take more memory than the container may expand to: nothing is kept."""


@dataclass(frozen=True)
class Decoded:
    """What came back: the values, and the names left out with their type and the reason."""

    values: dict[str, Any]
    skipped: tuple[Skipped, ...]


def skipped_warning(skip: Skipped) -> str:
    """The user's warning for a name that cannot come back: what, why and how to bring it back."""
    return (
        f"output `{skip.name}` ({skip.type}) cannot come back from an untrusted cluster: {skip.reason}. "
        f"Convert it in the cell to one of: {ALLOWED}; or run the cell on a trusted cluster."
    )


def decode(data: bytes | bytearray | memoryview, wanted: Collection[str] | None = None) -> Decoded:
    """Decode a container written by :func:`gpu_offload.runner.safe.encode`.

    Only names in ``wanted`` (the names the run was asked to send back) are looked at: a donor cannot
    add a variable the user did not ask for.
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise SafeDecodeError(f"the outputs are not one contiguous buffer: {exc}") from None
    manifest, blobs_at = _manifest(view)
    spans = _spans(manifest.get("blobs"), view.nbytes - blobs_at)
    names = manifest.get("names")
    skipped_raw = manifest.get("skipped", [])
    if not isinstance(names, dict) or not isinstance(skipped_raw, list):
        raise SafeDecodeError("the outputs manifest lacks its names; the runner that wrote it is not ours")
    budget = EXPANSION * view.nbytes + EXPANSION_SLACK
    reader = _Reader(view, blobs_at, spans, budget)
    values: dict[str, Any] = {}
    skipped: list[Skipped] = []
    for name, node in names.items():
        if wanted is not None and name not in wanted:
            continue
        try:
            values[name] = reader.node(node, 0)
        except _OverBudget as exc:
            raise SafeDecodeError(str(exc)) from None
        except Refused as exc:
            skipped.append(Skipped(name, _type_of(node), str(exc)))
        except RecursionError:
            skipped.append(Skipped(name, _type_of(node), "it is nested too deeply"))
    for entry in skipped_raw:
        if isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, str) for x in entry):
            name, kind, reason = (shown(x, MAX_TYPE_NAME) for x in entry)
            if wanted is not None and name not in wanted:
                continue
            skipped.append(Skipped(name, kind, f"where it ran: {reason}"))
    return Decoded(values, tuple(skipped))


def _manifest(view: memoryview) -> tuple[dict[str, Any], int]:
    head = len(MAGIC) + 8
    if view.nbytes < head or bytes(view[: len(MAGIC)]) != MAGIC:
        raise SafeDecodeError("the outputs are not in the safe format (no GPUOSAFE1 header); the runner "
                              "image is older than this kernel: rebuild it or run on a trusted cluster")
    length = int.from_bytes(view[len(MAGIC) : head], "little")
    if length > min(MAX_MANIFEST_BYTES, view.nbytes - head):
        raise SafeDecodeError(f"the outputs manifest claims {length} bytes, more than the data holds")
    try:
        manifest = json.loads(bytes(view[head : head + length]))
    except (ValueError, RecursionError) as exc:
        raise SafeDecodeError(f"the outputs manifest is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION:
        raise SafeDecodeError(f"the outputs manifest is not version {VERSION} of the safe format")
    return manifest, head + length


def _spans(raw: Any, available: int) -> list[tuple[int, int]]:
    if not isinstance(raw, list):
        raise SafeDecodeError("the outputs manifest lacks its blob list")
    spans: list[tuple[int, int]] = []
    for item in raw:
        ok = isinstance(item, list) and len(item) == 2 and all(type(x) is int for x in item)
        if not ok or not 0 <= item[0] <= item[1] <= available:
            raise SafeDecodeError(f"blob {len(spans)} of the outputs lies outside the data ({item!r:.80})")
        spans.append((item[0], item[1]))
    return spans


def _type_of(node: Any) -> str:
    kind = node.get("t") if isinstance(node, dict) else None
    return shown(kind, MAX_TYPE_NAME) if kind is not None else "unknown"


class _Reader:
    def __init__(self, view: memoryview, base: int, spans: list[tuple[int, int]], budget: int) -> None:
        self.view, self.base, self.spans = view, base, spans
        self.nodes = 0
        self.read: set[int] = set()
        self.budget, self.limit = budget, budget

    def charge(self, size: int) -> None:
        """Count ``size`` bytes of decoded values against the container's budget, before they are made."""
        self.budget -= size
        if self.budget < 0:
            raise _OverBudget(
                f"its values would take more than {self.limit} bytes ({EXPANSION} times the "
                f"{self.view.nbytes} bytes sent, plus {EXPANSION_SLACK >> 20} MiB); a runner never writes such "
                "outputs")

    def blob(self, index: Any) -> memoryview:
        if type(index) is not int or not 0 <= index < len(self.spans):
            raise Refused(f"it names blob {index!r:.40}, which does not exist")
        if index in self.read:
            # the runner writes a blob per value: a blob named again would be copied again, for each name
            raise Refused(f"it names blob {index}, which another value already read")
        self.read.add(index)
        start, end = self.spans[index]
        data = self.view[self.base + start : self.base + end]
        self.charge(data.nbytes)
        return data

    def node(self, node: Any, depth: int) -> Any:
        self.nodes += 1
        self.charge(_NODE_BYTES)
        if self.nodes > MAX_NODES:
            raise Refused(f"the outputs hold more than {MAX_NODES} values")
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise Refused("its description is malformed")
        tag = node["t"]
        try:
            return self._value(tag, node, depth)
        except (Refused, RecursionError, _OverBudget):
            raise
        except Exception as exc:  # noqa: BLE001 - a library parsing hostile bytes may raise anything
            detail = shown(f"{type(exc).__name__}: {exc}", MAX_TYPE_NAME)
            raise Refused(f"its {tag[:40]} data does not load safely ({detail})") from None

    def _value(self, tag: str, node: dict[str, Any], depth: int) -> Any:
        if tag in _SCALARS:
            value = node.get("v")
            self.charge(len(value) if isinstance(value, str) else 0)
            return _SCALARS[tag](value)
        if tag in ("bytes", "bytearray"):
            data = self.blob(node.get("b"))
            return bytes(data) if tag == "bytes" else bytearray(data)
        if tag in _COLLECTIONS:
            return self._collection(tag, node, depth)
        loader = LOADERS.get(tag)
        if loader is None:
            raise Refused(f"type tag {tag[:40]!r} is not one this kernel loads")
        value = loader(self.blob(node.get("b")), tag, self.charge)
        if tag == "parameter":
            import torch

            return torch.nn.Parameter(value, requires_grad=node.get("rg") is True)
        if tag == "tensor" and node.get("rg") is True:
            value.requires_grad_(True)  # a leaf that tracks gradients, as unpickling gives it back
        return value

    def _collection(self, tag: str, node: dict[str, Any], depth: int) -> Any:
        if depth >= MAX_DEPTH:
            raise Refused(f"it is nested deeper than {MAX_DEPTH} levels")
        if "tensors" in node and tag in ("dict", "odict"):
            tensors = load_tensors(self.blob(node["tensors"]), self.charge)
            return OrderedDict(tensors) if tag == "odict" else tensors
        items = node.get("items")
        if not isinstance(items, list):
            raise TypeError("items is not a list")
        if tag in ("dict", "odict"):
            pairs = []
            for pair in items:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise TypeError("a dict item is not a key and a value")
                pairs.append((self.node(pair[0], depth + 1), self.node(pair[1], depth + 1)))
            _check_hashes([key for key, _ in pairs])
            return _COLLECTIONS[tag](pairs)
        members = [self.node(item, depth + 1) for item in items]
        if tag in ("set", "frozenset"):
            _check_hashes(members)
        return _COLLECTIONS[tag](members)


_NODE_BYTES = 64
"""What one value costs beside its data (a Python object's header, a slot in its container)."""


def _check_hashes(keys: list[Any]) -> None:
    """Refuse keys crafted to share a hash: ints hash to themselves modulo 2**61 - 1, so a donor could make
    building a set or dict quadratic (a million such keys: hours)."""
    if len(keys) > MAX_HASH_COLLISIONS:
        distinct = len({hash(key) for key in keys})  # TypeError for an unhashable key: malformed
        if len(keys) - distinct > MAX_HASH_COLLISIONS:
            raise Refused(f"{len(keys) - distinct} of its keys share a hash with another")


def _bits(text: Any) -> float:
    if not isinstance(text, str) or len(text) != 16:
        raise ValueError("a float is not 16 hex digits")
    return float(struct.unpack("<d", bytes.fromhex(text))[0])


def _int(text: Any) -> int:
    if not isinstance(text, str) or len(text) > (1 << 20):
        raise ValueError("an int is not hex text of reasonable length")
    return int(text, 16)


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise ValueError("a bool is not true or false")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("a str is not text")
    return value


def _complex(value: Any) -> complex:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("a complex is not two floats")
    return complex(_bits(value[0]), _bits(value[1]))


_SCALARS: dict[str, Callable[[Any], Any]] = {
    "none": lambda _: None, "bool": _bool, "int": _int, "float": _bits, "complex": _complex, "str": _str,
}
# TypeError from an unhashable key or set member (a list inside a set) is a malformed value
_COLLECTIONS: dict[str, Callable[[Any], Any]] = {
    "list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "dict": dict, "odict": OrderedDict,
}
