"""How much GPU memory a training cell needs, worked out before it is placed, on no GPU at all.

The estimate runs the cell's training step for real, but on PyTorch's ``meta`` device: the model's
structure, its optimizer and a batch of the shapes the cell uses, with no data and no arithmetic. A dispatch
mode counts the bytes of every tensor storage alive after each operation, so the peak includes what people
forget when they guess: gradients, the optimizer's state (Adam keeps two tensors per parameter), activations
saved for backward, and the optimizer's temporaries. The step is run twice and the second one is measured,
because a real training loop spends its time in steady steps where the optimizer state already exists.

What it does not see: work memory that kernels allocate outside the tensors they return (on the CPU here a
convnet's steady step holds what the estimate says, within 1%: oneDNN's convolutions keep no work memory
worth counting between operations), the CUDA context (a few hundred MiB per process, outside PyTorch's
allocator), cuDNN and cuBLAS workspaces on a GPU (not measured here: no GPU), the caching allocator's rounding
and fragmentation; ``MARGIN`` covers the last two and the request adds ``CONTEXT`` for the context. After a run, the measured peak (``torch.cuda.max_memory_allocated``)
is recorded and beats the estimate for the same cell next time (``PeakBook``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIB = 2**20
GIB = 2**30
MARGIN = 0.10
"""Added to an estimate (and to a recorded peak): allocator rounding and fragmentation, library workspaces."""
CONTEXT = 512 * MIB
"""The CUDA context and kernels loaded, per process, outside PyTorch's allocator."""
ROUND = 256 * MIB


@dataclass(frozen=True)
class MemoryEstimate:
    """The bytes a training step holds at its peak, and what they are made of."""

    parameters: int
    optimizer_state: int
    peak: int
    """Bytes of tensors alive at once at the worst point of a steady training step (parameters included)."""
    source: str = "estimate"
    """``estimate`` (worked out on the meta device) or ``measured`` (a recorded peak of an earlier run)."""

    @property
    def transient(self) -> int:
        """Gradients, activations and temporaries at the peak: what the batch size changes."""
        return max(0, self.peak - self.parameters - self.optimizer_state)

    def request(self) -> int:
        """The GPU memory to ask for: the peak plus ``MARGIN`` plus the CUDA context, rounded up to 256 MiB."""
        need = self.peak * (1 + MARGIN) + CONTEXT
        return int(math.ceil(need / ROUND) * ROUND)

    def describe(self) -> str:
        return (
            f"{_size(self.request())} of GPU memory ({self.source}: peak {_size(self.peak)} = parameters "
            f"{_size(self.parameters)} + optimizer state {_size(self.optimizer_state)} + gradients, activations "
            f"and temporaries {_size(self.transient)}; plus {MARGIN:.0%} and {_size(CONTEXT)} for the CUDA context)"
        )


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _live_bytes_mode() -> Any:
    """A dispatch mode that records the peak of live tensor-storage bytes (built lazily: torch is optional)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self, existing: list[Any]) -> None:
            super().__init__()
            self.live: dict[int, tuple[Any, int]] = {}
            for t in existing:
                self._track(t)
            self.peak = self._now()

        def _track(self, t: Any) -> None:
            storage = t.untyped_storage()
            key = storage._cdata
            if key not in self.live:
                self.live[key] = (StorageWeakRef(storage), storage.nbytes())

        def _now(self) -> int:
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                del self.live[key]
            return sum(n for _, n in self.live.values())

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._track(t)
            self.peak = max(self.peak, self._now())
            return out

    return LiveBytes


def _on_meta(model: Any) -> Any:
    """A copy of ``model`` whose parameters and buffers live on the meta device (no weights are copied)."""
    import torch

    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def _default_loss(output: Any) -> Any:
    return output.float().pow(2).mean()


def estimate_training_step(
    model: Any,
    batch: Any,
    optimizer: type | None = None,
    optimizer_options: Mapping[str, Any] | None = None,
    loss: Callable[[Any], Any] = _default_loss,
) -> MemoryEstimate:
    """The peak memory of one steady training step of ``model`` on ``batch`` with ``optimizer``.

    ``model`` is the cell's own module (left untouched: a structural copy on the meta device is used);
    ``batch`` a tensor or a tuple of tensors of the shapes the cell trains on (their data is never read);
    ``optimizer`` a ``torch.optim`` class (Adam by default) and its options; ``loss`` maps the model's output
    to a scalar (the default's memory is that of any reduction).
    """
    import torch

    meta = _on_meta(model)
    inputs = batch if isinstance(batch, tuple | list) else (batch,)
    meta_inputs = [torch.empty_like(t, device="meta") for t in inputs]
    opt = (optimizer or torch.optim.Adam)(meta.parameters(), **dict(optimizer_options or {"lr": 1e-3}))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(meta(*meta_inputs)).backward()
        opt.step()

    step()  # creates the optimizer's state: the measured step is a steady one
    params = list(meta.parameters()) + list(meta.buffers())
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    with _live_bytes_mode()([*params, *state, *meta_inputs]) as live:
        step()
    return MemoryEstimate(
        parameters=sum(t.untyped_storage().nbytes() for t in params),
        optimizer_state=sum(t.untyped_storage().nbytes() for t in state if t.dim() > 0),
        peak=live.peak,
    )


def cell_key(source: str, shapes: Mapping[str, tuple[int, ...]]) -> str:
    """What identifies "the same cell" for a recorded peak: its text and the shapes of its tensor inputs."""
    text = json.dumps({"source": source, "shapes": {k: list(v) for k, v in sorted(shapes.items())}})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class PeakRecord:
    peak: int
    gpu_model: str | None = None


class PeakBook:
    """Measured peaks of earlier runs, per cell, in a small JSON file of the user's (one writer: the kernel)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def record(self, key: str, record: PeakRecord) -> None:
        data = self._load()
        data[key] = asdict(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)  # a crash mid-write leaves the previous book, never half of one

    def recorded(self, key: str) -> MemoryEstimate | None:
        entry = self._load().get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("peak"), int) or entry["peak"] <= 0:
            return None
        return MemoryEstimate(parameters=0, optimizer_state=0, peak=entry["peak"], source="measured")


def out_of_memory_advice(had: int | None, peak: int | None) -> str:
    """What a cell that ran out of GPU memory tells its user: how much it had and what to ask for next."""
    had_text = f"it had {_size(had)}" if had else "its GPU's memory was not reported"
    if peak:
        ask = MemoryEstimate(0, 0, peak).request()
        return f"the cell ran out of GPU memory ({had_text}, it reached {_size(peak)}); ask for --gpu-memory " \
               f"{math.ceil(ask / GIB)}Gi or more, or use %%gpu_offload --estimate to see where it goes"
    return f"the cell ran out of GPU memory ({had_text}); run it with --estimate to see what it needs"
