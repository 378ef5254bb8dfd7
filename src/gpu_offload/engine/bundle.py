"""Turns a cell, its analysis and the user namespace into a job for a backend.

The bundle format belongs to the runner (:mod:`.runner.bundle`); this module adds what the notebook side
needs: naming the variable that cannot be pickled, and leaving no buffer behind when that happens.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from ..runner import buffers
from ..runner.bundle import encode_bundle, make_bundle
from . import preimport
from .analysis import CellAnalysis
from .backends.base import Job, RunRequest, Transfer
from .errors import InputNotSerializable


def build_job(
    cell: str,
    analysis: CellAnalysis,
    namespace: Mapping[str, Any],
    transfer: Callable[[str], Transfer],
    *,
    filename: str = "<offloaded cell>",
    first_line: int = 2,
    request: RunRequest | None = None,
    session: str | None = None,
    script: Mapping[str, Any] | None = None,
) -> tuple[Job, tuple[dict[str, Any], ...]]:
    """Pickle the inputs into a bundle; returns the job and the input buffer references.

    ``transfer`` is the backend's choice for a run id (``backend.transfer``), asked once here: the bundle is
    pickled once, with the transports and upload URLs of this run. ``script`` runs ``cell`` as a script
    (``gpu-offload run``; see :mod:`.runner.script`). ``first_line`` is the notebook line of the cell body (2, below the ``%%gpu_offload`` line). The caller
    discards the references once the run ends (the runner unlinks those it maps; a runner that never
    started leaves them). An input that cannot be pickled raises :class:`InputNotSerializable` first.
    """
    values = {name: namespace[name] for name in analysis.inputs}
    run_id = secrets.token_hex(8)
    ranks = request.ranks if request is not None else None
    chosen = transfer(run_id)
    try:
        bundle = make_bundle(
            cell,
            inputs=values,
            modules=analysis.modules,
            outputs=analysis.outputs,
            required_outputs=analysis.required_outputs,
            run_id=run_id,
            filename=filename,
            first_line=first_line,
            script=script,
            ranks=None if ranks is None else ranks.bundle_field(),
            **dataclasses.asdict(chosen),  # the transfer's fields are the bundle's of the same names
        )
    except Exception as exc:  # pickling raises many types; find the variable to blame
        raise _blame(values, exc) from exc
    refs = tuple(bundle["buffers"])
    try:
        data = encode_bundle(bundle)
    except BaseException:
        buffers.discard(refs)
        raise
    # a script's own directory comes first on its sys.path, so only a cell's imports are known ahead
    ahead = preimport.chosen(analysis) if script is None and session is None and ranks is None else ()
    job = Job(run_id=bundle["run_id"], nonce=bundle["nonce"], bundle=data, request=request or RunRequest(),
              session=session, preimport=ahead)
    return job, refs


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
