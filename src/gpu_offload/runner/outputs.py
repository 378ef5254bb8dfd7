"""Sending the cell's variables back: CUDA tensors to CPU, unpicklable values skipped or refused.

A value the user asked for with ``--out`` (``required_outputs``) must arrive, so failing to pickle it is an
error; any other assigned name that cannot travel is skipped with a warning naming it and its type.

On a cluster the kernel does not trust, the outputs go in the safe format (:mod:`.safe`) instead of a
pickle: the bundle's ``output_format``, or :data:`FORMAT_ENV` set on the pod when it was placed there
(the bundle is made before placement). The kernel refuses a pickle from such a cluster whatever is sent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from . import buffers
from .failures import CellFailed, fail

Emit = Callable[..., None]
FORMAT_ENV = "GPU_OFFLOAD_OUTPUT_FORMAT"
"""``safe`` on a runner pod placed on an untrusted cluster (``liqo_peering.environment.OUTPUT_FORMAT``)."""
SAFE = "safe"


def wants_safe(bundle: dict[str, Any]) -> bool:
    """Whether this run sends its outputs in the safe format (either source may ask; none can unask)."""
    return bundle.get("output_format") == SAFE or os.environ.get(FORMAT_ENV) == SAFE


def cuda_to_cpu(obj: Any) -> Any:
    """Pickler hook: a CUDA tensor (anywhere inside a value) is pickled as its CPU copy."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor) or not getattr(obj, "is_cuda", False):
        return NotImplemented
    return obj.cpu().__reduce_ex__(5)


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def send(emit: Emit, bundle: dict[str, Any], namespace: dict[str, Any]) -> None:
    """Pickle the wanted names and send one ``outputs`` frame (buffers through the bundle's transport)."""
    required = list(dict.fromkeys(bundle["required_outputs"]))
    names = list(dict.fromkeys([*bundle["outputs"], *required]))
    missing = [name for name in required if name not in namespace]
    if missing:
        raise fail(
            emit,
            "NameError",
            f"--out {', '.join(missing)}: the cell did not assign {', '.join(f'`{m}`' for m in missing)}; "
            "assign it in the cell or drop it from --out",
        )
    values = {name: namespace[name] for name in names if name in namespace}
    _drop_process_bound(emit, values, required)
    if not values:
        return  # the engine treats a run without an ``outputs`` frame as one with nothing to load
    emit("status", state="sending outputs")
    _warn_cuda(emit, values)
    if wants_safe(bundle):
        _send_safe(emit, bundle, values, required)
        return
    try:
        try:
            dumped = _dump(bundle, values)
        except buffers.BufferTransportError:
            raise
        except Exception:
            # only now look for the culprits: checking each value up front would pickle everything twice
            _drop_unpicklable(emit, values, required)
            if not values:
                return
            dumped = _dump(bundle, values)
    except CellFailed:
        raise
    except buffers.BufferTransportError as exc:
        raise fail(emit, "BufferTransportError", f"the cell's outputs cannot be sent back: {exc}") from None
    except Exception as exc:  # pickles one by one but not together (rare): name them all
        raise fail(
            emit,
            "PicklingError",
            f"outputs {', '.join(values)} cannot be pickled together: {exc}; "
            "send fewer variables back (--out) or convert them to plain data",
        ) from None
    _emit_outputs(emit, bundle, values, dumped)


def _send_safe(emit: Emit, bundle: dict[str, Any], values: dict[str, Any], required: list[str]) -> None:
    """One ``outputs`` frame holding a safe container; names that do not encode are listed inside it (the
    kernel warns about them), unless ``--out`` asked for one: then the run fails, as for a pickling error."""
    from . import safe

    encoded = safe.encode(values)
    refused = [skip for skip in encoded.skipped if skip.name in required]
    if refused:
        what = "; ".join(f"output `{s.name}` ({s.type}): {s.reason}" for s in refused)
        raise fail(
            emit,
            "PicklingError",
            f"{what}. This cluster is not trusted by your notebook, so outputs come back only as {safe.ALLOWED}; "
            "it was asked for with --out, so the run fails: convert it in the cell, drop it from --out, or run "
            "on a trusted cluster",
        )
    # join at once: the parts are views of the cell's live arrays, which a thread of the cell may still change
    data, encoded_skipped = encoded.tobytes(), encoded.skipped
    del encoded
    transport, shm_dir, urls = bundle["output_transport"], bundle["shm_dir"], bundle["output_urls"]
    try:
        packed = buffers.pack_main(data, transport, shm_dir=shm_dir, urls=urls, index=0)
    except buffers.BufferTransportError as exc:
        raise fail(emit, "BufferTransportError", f"the cell's outputs cannot be sent back: {exc}") from None
    try:
        skipped = {skip.name for skip in encoded_skipped}
        emit("outputs", names=[n for n in values if n not in skipped], pickle=packed, buffers=[], format=SAFE)
    except BaseException:
        buffers.discard([packed] if isinstance(packed, dict) else [])
        raise


def _drop_unpicklable(emit: Emit, values: dict[str, Any], required: list[str]) -> None:
    """Remove from ``values`` what cannot be pickled, with a warning; fail if ``--out`` asked for it."""
    for name in list(values):
        error = buffers.pickling_error(values[name], cuda_to_cpu)
        if error is None:
            continue
        what = f"output `{name}` ({_type_name(values[name])}) cannot be pickled: {error}"
        if name in required:
            raise fail(
                emit,
                "PicklingError",
                f"{what}; it was asked for with --out, so the run fails: convert it to a picklable value "
                "in the cell (e.g. a list, an array, a state_dict) or drop it from --out",
            )
        emit("warning", text=f"{what}; skipped (it stays where the cell ran)")
        del values[name]


def _drop_process_bound(emit: Emit, values: dict[str, Any], required: list[str]) -> None:
    """A ``DistributedDataParallel`` pickles, but unpickling it needs the process group, which ends with the
    run: loading it in the notebook would fail all outputs. Skip it with a warning (fail if ``--out`` asked)."""
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    ddp = getattr(ddp_module, "DistributedDataParallel", None)
    if ddp is None:
        return
    for name in [n for n, v in values.items() if isinstance(v, ddp)]:
        what = (f"output `{name}` (DistributedDataParallel) is bound to the run's process group, which does not "
                f"exist in the notebook; send `{name}.module` or its state_dict() back instead")
        if name in required:
            raise fail(emit, "PicklingError", f"{what} (it was asked for with --out, so the run fails)")
        emit("warning", text=f"{what}; skipped")
        del values[name]


def _warn_cuda(emit: Emit, values: dict[str, Any]) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    moved = [n for n, v in values.items() if isinstance(v, torch.Tensor) and getattr(v, "is_cuda", False)]
    if moved:
        emit(
            "warning",
            text=f"CUDA tensor(s) {', '.join(moved)} moved to CPU before sending back (the notebook may "
            "have no GPU); call .cuda() on them if it does",
        )


def _dump(bundle: dict[str, Any], values: dict[str, Any]) -> buffers.Dumped:
    transport, shm_dir, urls = bundle["output_transport"], bundle["shm_dir"], bundle["output_urls"]
    return buffers.dump(values, transport, shm_dir=shm_dir, urls=urls, reducer=cuda_to_cpu)


def _emit_outputs(emit: Emit, bundle: dict[str, Any], values: dict[str, Any], dumped: buffers.Dumped) -> None:
    transport, shm_dir, urls = bundle["output_transport"], bundle["shm_dir"], bundle["output_urls"]
    written: list[Any] = list(dumped.buffers)
    try:
        packed = buffers.pack_main(
            dumped.pickle, transport, shm_dir=shm_dir, urls=urls, index=len(dumped.buffers)
        )
        if isinstance(packed, dict):
            written.append(packed)
        emit("outputs", names=list(values), pickle=packed, buffers=buffers.json_refs(dumped.buffers))
    except BaseException:
        # nobody will read these files now: an interrupted or failed send must not leak shared memory
        buffers.discard(written)
        raise
