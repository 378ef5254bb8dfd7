"""What the kernel takes from a run on a cluster it does not trust: outputs only as a safe container, rich
output only through the allowlist.

Everything in such a run's ``outputs`` frame was written by whoever runs the donor's pod: the format it
claims, the names, and every buffer reference. So nothing in the frame is acted on beyond reading bytes
the frame itself carries: a pickle is refused, a ``shm`` or path reference is neither opened nor unlinked
(it could name any file of the kernel's), a ``url`` reference is not fetched (the kubernetes backend has
already replaced the run's own uploads by their bytes; any other URL is someone else's). Only the names the
kernel asked for are read.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...runner.frames import Outputs
from ..errors import OffloadError
from .decode import SafeDecodeError, decode, skipped_warning

UNTOUCHED = "Nothing was loaded; your variables are untouched."


class UntrustedOutputs(OffloadError):
    """Outputs from an untrusted cluster that the kernel refuses; the message names why and what to do."""


@dataclass(frozen=True)
class Wanted:
    """The names the kernel asked a run for: those the cell assigns, and those of ``--out`` (required)."""

    outputs: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    imports: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    """Names the cell bound by importing (``CellAnalysis.imports``): the kernel imports them itself, since a
    module never travels in the safe format (and the module to import comes from the user's cell, not the
    donor)."""


def _refuse(cluster: str, why: str) -> UntrustedOutputs:
    return UntrustedOutputs(
        f"The cell ran on {cluster}, a cluster this notebook does not trust, and its outputs were refused: "
        f"{why}. {UNTOUCHED} An untrusted cluster can only send plain data back; if its runner was not ours, "
        "tell your admin. To get arbitrary Python objects back, run on a trusted cluster (--trusted-only)."
    )


def container_bytes(outputs: Outputs, cluster: str) -> bytes:
    """The safe container an untrusted run's frame carries: inline base64, or bytes the backend fetched."""
    if outputs.format != "safe":
        raise _refuse(cluster, f"they came as {str(outputs.format)[:40]!r}, and a pickle from an untrusted "
                      "cluster could run code in this kernel, so it is never loaded")
    packed = outputs.pickle
    if isinstance(packed, Mapping) and packed.get("kind") != "inline":
        kind, reason = packed.get("kind"), packed.get("reason")
        if kind == "refused" and isinstance(reason, str):  # the backend's own verdict on the reference
            raise _refuse(cluster, reason[:300])
        where = {"shm": "a file on this machine", "url": "a URL that is not one of this run's uploads"}
        detail = where.get(str(kind), f"a reference of kind {str(kind)[:40]!r}")
        raise _refuse(cluster, f"they point at {detail}, which is not read from an untrusted cluster")
    if outputs.buffers:
        raise _refuse(cluster, "they name buffer references, which safe outputs never use")
    data = packed.get("data") if isinstance(packed, Mapping) else packed
    if isinstance(data, str):
        return _base64(data, cluster)
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    raise _refuse(cluster, "the frame holds no container")


def _base64(text: str, cluster: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(cluster, "the container is not base64") from None


def load_untrusted(outputs: Outputs, cluster: str, wanted: Wanted, notice: Callable[[str], None]) -> dict[str, Any]:
    """The values of an untrusted run's outputs: each name that cannot come back is a notice, and an error
    when ``--out`` asked for it (then nothing is returned, so nothing is overwritten)."""
    data = container_bytes(outputs, cluster)
    names: Collection[str] = {*wanted.outputs, *wanted.required}
    try:
        decoded = decode(data, wanted=names)
    except SafeDecodeError as exc:
        raise _refuse(cluster, str(exc)) from None
    values = dict(decoded.values)
    skipped = []
    for skip in decoded.skipped:
        imported = _import(wanted.imports.get(skip.name))
        if imported is _NOT_IMPORTED:
            skipped.append(skip)
        else:
            values[skip.name] = imported
    lost = {skip.name for skip in skipped}
    missing = [name for name in wanted.required if name not in values]
    if missing:
        why = "; ".join(skipped_warning(s) for s in skipped if s.name in missing)
        raise UntrustedOutputs(
            f"--out {', '.join(missing)}: did not come back from {cluster}, a cluster this notebook does not "
            f"trust{': ' + why if why else ' (the runner did not send it)'}. {UNTOUCHED}"
        )
    for skip in skipped:
        notice(f"warning: {skipped_warning(skip)}")
    return {name: value for name, value in values.items() if name not in lost}


_NOT_IMPORTED = object()


def _import(target: tuple[str, str | None] | None) -> Any:
    """What the cell's import statement binds, imported here; ``_NOT_IMPORTED`` when it cannot be."""
    if target is None:
        return _NOT_IMPORTED
    module, attribute = target
    try:
        found = importlib.import_module(module)
        if attribute is None:
            return found
        try:
            return getattr(found, attribute)
        except AttributeError:
            return importlib.import_module(f"{module}.{attribute}")
    except Exception:  # noqa: BLE001 - not installed in the kernel: the name stays a warning
        return _NOT_IMPORTED
