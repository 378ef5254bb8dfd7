"""Turns a cell, its analysis and the user namespace into a job for a backend.

The bundle format belongs to the runner (:mod:`.runner.bundle`); this module adds what the notebook side
needs: naming the variable that cannot be pickled, and leaving no buffer behind when that happens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cloudpickle

from .analysis import CellAnalysis
from .backends.base import Job, Transfer
from .errors import InputNotSerializable
from .runner import buffers
from .runner.bundle import encode_bundle, make_bundle


def build_job(
    cell: str,
    analysis: CellAnalysis,
    namespace: Mapping[str, Any],
    transfer: Transfer,
    *,
    filename: str = "<offloaded cell>",
    first_line: int = 2,
) -> tuple[Job, tuple[dict[str, Any], ...]]:
    """Pickle the inputs into a bundle; returns the job and the input buffer references.

    ``first_line`` is the notebook line of the cell body (2, below the ``%%gpu_offload`` line). The caller
    discards the references once the run ends (the runner unlinks those it maps; a runner that never
    started leaves them). An input that cannot be pickled raises :class:`InputNotSerializable` first.
    """
    values = {name: namespace[name] for name in analysis.inputs}
    try:
        bundle = make_bundle(
            cell,
            inputs=values,
            input_transport=transfer.output_transport,
            modules=analysis.modules,
            outputs=analysis.outputs,
            required_outputs=analysis.required_outputs,
            output_transport=transfer.output_transport,
            shm_dir=transfer.shm_dir,
            filename=filename,
            first_line=first_line,
        )
    except Exception as exc:  # pickling raises many types; find the variable to blame
        raise _blame(values, exc) from exc
    refs = tuple(bundle["buffers"])
    try:
        data = encode_bundle(bundle)
    except BaseException:
        buffers.discard(refs)
        raise
    return Job(run_id=bundle["run_id"], nonce=bundle["nonce"], bundle=data), refs


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _blame(values: Mapping[str, Any], cause: Exception) -> Exception:
    for name, value in values.items():
        try:
            # buffers stay out of band and are not copied: no more memory than the failed attempt
            cloudpickle.CloudPickler(_Discard(), protocol=5, buffer_callback=lambda _: False).dump(value)
        except Exception as exc:
            kind = type(value)
            return InputNotSerializable(name, f"{kind.__module__}.{kind.__qualname__}", str(exc) or repr(exc))
    return cause
