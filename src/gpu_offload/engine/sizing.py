"""``--estimate``: the GPU memory a cell asks for, from its model before the run and from its measured peak after.

Before a run, the cell's inputs are looked at as they are in the notebook: a ``torch.nn.Module`` is the model,
the first tensor it reads is the batch, an optimizer it reads gives the optimizer's class and settings (Adam
otherwise). ``estimate.estimate_training_step`` works out the peak on the meta device; when the same cell
(its text and its tensors' shapes, ``estimate.cell_key``) ran before and its runner reported a peak, that
peak is used instead. Either way the request asks for it plus ``estimate.MARGIN`` and the CUDA context.

torch is never imported here: a notebook that has not imported it has no model to estimate.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import OffloadUsageError
from .estimate import (
    MemoryEstimate,
    PeakBook,
    PeakRecord,
    cell_key,
    estimate_training_step,
    out_of_memory_advice,
)
from .request import OffloadRequest

OOM_NAMES = frozenset({"OutOfMemoryError"})
"""``torch.cuda.OutOfMemoryError``'s name, as the runner reports the cell's error."""


@dataclass(frozen=True)
class Sizing:
    """What ``--estimate`` decided for one cell: the request to send, the sentence to show and the cell's key."""

    request: OffloadRequest
    notice: str
    key: str


def _inputs_of(names: Sequence[str], namespace: Mapping[str, Any], torch: Any) -> tuple[Any, list[Any], Any]:
    model = next((namespace[n] for n in names if isinstance(namespace.get(n), torch.nn.Module)), None)
    tensors = [namespace[n] for n in names if isinstance(namespace.get(n), torch.Tensor)]
    optimizer = next((namespace[n] for n in names if isinstance(namespace.get(n), torch.optim.Optimizer)), None)
    return model, tensors, optimizer


def size(request: OffloadRequest, inputs: Sequence[str], namespace: Mapping[str, Any], book: PeakBook) -> Sizing:
    """The request with ``gpu_memory`` set from the cell's recorded peak or its estimate (a ``--gpu-memory``
    given wins and is only explained). Raises ``OffloadUsageError`` saying what the cell lacks."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise OffloadUsageError("--estimate: this notebook has not imported torch, so the cell reads no torch "
                                "model to estimate. Train a torch.nn.Module the notebook defines, or ask for "
                                "memory yourself with --gpu-memory 12Gi.")
    model, tensors, optimizer = _inputs_of(inputs, namespace, torch)
    key = cell_key(request.cell, {n: tuple(namespace[n].shape) for n in inputs
                                  if isinstance(namespace.get(n), torch.Tensor)})
    found: MemoryEstimate | None = book.recorded(key)
    if found is None:
        if model is None or not tensors:
            missing = "torch.nn.Module" if model is None else "tensor to use as the batch"
            raise OffloadUsageError(f"--estimate: the cell reads no {missing} from the notebook, and it has no "
                                    "measured peak from an earlier run. Pass the model and a batch of the "
                                    "training shapes as variables the cell reads, or ask with --gpu-memory 12Gi.")
        try:
            found = estimate_training_step(model, tensors[0], type(optimizer) if optimizer is not None else None,
                                           dict(optimizer.defaults) if optimizer is not None else None)
        except Exception as exc:  # the model's own code on the meta device; say which step failed
            raise OffloadUsageError(f"--estimate: a training step of the model on the first tensor the cell reads "
                                    f"failed on the meta device ({type(exc).__name__}: {exc}). Ask with "
                                    "--gpu-memory instead.") from None
    if request.gpu_memory is not None:
        return Sizing(request, f"the cell asked for --gpu-memory itself; --estimate says {found.describe()}", key)
    sized = dataclasses.replace(request, gpu_memory=found.request())
    return Sizing(sized, f"asking for {found.describe()}", key)


TRAINS = "backward("
"""What makes a cell a training cell for the automatic estimate: it runs backward (``loss.backward()``)."""


def advise(request: OffloadRequest, inputs: Sequence[str], namespace: Mapping[str, Any],
           book: Callable[[], PeakBook]) -> Sizing | None:
    """Without ``--estimate``: when the cell trains a torch model from the notebook's inputs, what its step needs
    (its recorded peak, else the estimate), said beside what it asks for; the request is unchanged (a whole GPU
    asked for is not made a part behind the user's back), and the key lets its measured peak be recorded. None
    when the cell is not such a cell, or the estimate cannot be made: it never stops a cell."""
    torch = sys.modules.get("torch")
    if request.estimate or torch is None or TRAINS not in request.cell:
        return None
    model, tensors, optimizer = _inputs_of(inputs, namespace, torch)
    if model is None or not tensors:
        return None
    key = cell_key(request.cell, {n: tuple(namespace[n].shape) for n in inputs
                                  if isinstance(namespace.get(n), torch.Tensor)})
    found: MemoryEstimate | None = book().recorded(key)
    if found is None:
        try:
            found = estimate_training_step(model, tensors[0], type(optimizer) if optimizer is not None else None,
                                           dict(optimizer.defaults) if optimizer is not None else None)
        except Exception:  # the model's own code on the meta device: no advice, the cell runs as asked
            return None
    return Sizing(request, f"this cell trains a torch model and needs {found.describe()}; it asks for "
                           f"{_asked(request)}: --estimate asks for just what it needs", key)


def _asked(request: OffloadRequest) -> str:
    if request.gpu_memory is not None:
        return f"--gpu-memory {request.gpu_memory / 2**30:.2f} GiB"
    if request.fraction is not None:
        return f"{request.fraction:g} of a GPU"
    if request.gpus == 0:
        return "no GPU (--gpus 0)"
    return f"{request.gpus} whole GPU{'s' * (request.gpus != 1)}"


def record_peak(book: PeakBook, key: str, peak: int | None, gpu_model: str | None = None) -> bool:
    """Keep a run's measured peak for the next ``--estimate`` of the same cell; False when there was none."""
    if not peak:
        return False
    book.record(key, PeakRecord(peak, gpu_model))
    return True


def oom_advice(error_name: str | None, had: int | None, peak: int | None) -> str | None:
    """What a cell that ran out of GPU memory is told: how much it had and what to ask for; None otherwise."""
    if error_name not in OOM_NAMES:
        return None
    return out_of_memory_advice(had, peak)
