"""The runner watches the GPU memory it holds and stops a cell that grows past its part of a GPU.

``gpu_cap`` limits what torch allocates; nothing limits CuPy, JAX, a CUDA extension or the CUDA context, and on
a time-sliced GPU (no isolation) memory past the part is memory a neighbour's cell may need. So while a cell
runs, the runner's ticker (``ticker``) reads how much GPU memory this process holds and, once it holds more than its part, stops the
cell with an error naming the part and what to ask for instead (:func:`verdict`, pure).

What the process holds is read from every source there is (:data:`SOURCES`; the largest reading wins):

- PyTorch's caching allocator (``torch.cuda.memory_reserved``), when the cell imported torch and CUDA started;
- NVML's per-process accounting (``nvmlDeviceGetComputeRunningProcesses``) of the visible GPU, which counts
  every library and the context. Inside a container NVML reports the host's process ids, so it finds this
  process only where the runner shares the host's PID namespace (a local run); torch's reading remains.

A GPU is not something this machine's tests have: a source is a function returning a :class:`Reading`, and the
tests append one that plays a GPU (``tests/runner/fake_gpu.py``); the watch, the stop and the message are the
runner's own code either way.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import NamedTuple

from . import gpu_cap

GIB = 2**30
# NamedTuples, not dataclasses: the runner's cold start imports no dataclasses module for this
MARGIN = 1.1
"""What the fix asks for: the memory seen, plus 10% (the estimate's margin, docs/sharing.md)."""


class Reading(NamedTuple):
    """One look at the GPU: bytes this process holds on it, and the GPU's total (None: unknown)."""

    used: int
    total: int | None = None


Source = Callable[[], "Reading | None"]


def _torch_reading() -> Reading | None:
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return Reading(int(torch.cuda.memory_reserved(0)), int(torch.cuda.get_device_properties(0).total_memory))
    except Exception:  # a broken CUDA state is the cell's to report, not the watch's
        return None


def _nvml_reading() -> Reading | None:
    from . import metrics

    handles = metrics.visible_handles()
    if not handles:
        return None
    import pynvml

    handle = handles[0][1]  # a part of a GPU is part of one GPU: the first visible one
    try:
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
    except Exception:
        return None
    used = sum(int(p.usedGpuMemory or 0) for p in mine)
    return Reading(used, total) if mine else None


SOURCES: list[Source] = [_torch_reading, _nvml_reading]
"""Where the runner reads the GPU memory it holds; a test appends a fake GPU's reading here."""


def read() -> Reading | None:
    """The largest reading of every source (each sees part of what the process holds), or None."""
    readings = [r for r in (_safely(source) for source in SOURCES) if r is not None]
    if not readings:
        return None
    totals = [r.total for r in readings if r.total]
    return Reading(max(r.used for r in readings), max(totals) if totals else None)


def _safely(source: Source) -> Reading | None:
    try:
        return source()
    except Exception:
        return None


class Limit(NamedTuple):
    """The part of a GPU the runner holds, as the origin told it (docs/runner-protocol.md)."""

    limit: int | None
    """Bytes it may use, when the origin knew them."""
    fraction: float | None
    """The share of the GPU asked for, when no byte figure was known."""
    sharing: str
    isolation: str

    def bytes_of(self, total: int | None) -> int | None:
        if self.limit is not None:
            return self.limit
        return int(self.fraction * total) if self.fraction is not None and total else None

    def phrase(self, limit: int) -> str:
        part = f"{self.fraction:g} of a GPU, " if self.fraction is not None and self.limit is None else ""
        return f"{part}{limit / GIB:.1f} GiB"


def limit_of(environ: Mapping[str, str]) -> Limit | None:
    """The runner's part of a GPU, or None when it holds whole GPUs (nothing to watch)."""
    limit = gpu_cap.number(environ.get(gpu_cap.MEMORY_LIMIT))
    fraction = gpu_cap.number(environ.get(gpu_cap.FRACTION))
    if limit is None and (fraction is None or fraction >= 1):
        return None
    return Limit(int(limit) if limit is not None else None, fraction if fraction is not None else None,
                 environ.get(gpu_cap.SHARING) or "unknown", environ.get(gpu_cap.ISOLATION) or "unknown")


def verdict(reading: Reading, part: Limit) -> str | None:
    """The error that stops a cell holding more GPU memory than its part (None: within it, or unknown)."""
    limit = part.bytes_of(reading.total)
    if limit is None or reading.used <= limit:
        return None
    ask = math.ceil(reading.used * MARGIN / GIB)
    why = ("it would take memory the other cells on this GPU need (the donor shares it by time-slicing, "
           "which does not isolate memory)" if part.isolation == "none" else "the donor keeps it to its part")
    if reading.total is not None and ask * GIB >= reading.total:
        fix = "Ask for a whole GPU with --gpus 1"
    else:
        fix = f"Ask for --gpu-memory {ask}Gi, or a whole GPU with --gpus 1"
    return (f"the cell was stopped: it held {reading.used / GIB:.1f} GiB of GPU memory, more than its part "
            f"({part.phrase(limit)}; {part.sharing}), and {why}. {fix}; output so far is kept, no variable "
            "was copied back")


class Watch:
    """Reads the GPU memory the process holds at each tick of the run's :class:`~.ticker.Ticker` while a cell
    runs; the first reading past the part records why (:attr:`stopped`) and calls ``stop`` (interrupting the
    cell)."""

    NAME = "GpuMemoryExceeded"
    """The error's name in the cell's ``error`` frame."""

    def __init__(self, stop: Callable[[], None], environ: Mapping[str, str] | None = None) -> None:
        self._stop_cell = stop
        self._environ = os.environ if environ is None else environ
        self.stopped: str | None = None
        """Why the cell was stopped, once it was."""

    def task(self) -> Callable[[], None] | None:
        """This run's watch, when the runner holds part of a GPU; otherwise None (nothing to watch)."""
        part = limit_of(self._environ)
        self.stopped = None
        return None if part is None else functools.partial(self._check, part)

    def _check(self, part: Limit) -> None:
        if self.stopped is not None:  # stopped once: the cell is being interrupted
            return
        reading = read()
        why = verdict(reading, part) if reading is not None else None
        if why is not None:
            self.stopped = why
            self._stop_cell()
