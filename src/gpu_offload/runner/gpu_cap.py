"""The runner's own cap on GPU memory when it holds part of a GPU (docs/sharing.md).

The origin tells the runner, in its environment, the donor's sharing mode, the isolation the pod gets and the
memory it may use (``GPU_OFFLOAD_GPU_*``, docs/runner-protocol.md). Where the mode lets a process limit itself:

- under MPS, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (read by the CUDA driver when the process creates its
  context, so it is set before any cell runs; a limit the pod already has is kept);
- with PyTorch, ``torch.cuda.set_per_process_memory_fraction`` once the cell imports torch, and only when
  a GPU is there: importing torch costs seconds, so the runner never does it for a cell that does not.

The cap makes a cell that grows past its part fail with CUDA's out-of-memory error instead of taking memory
its neighbours hold; isolation (which a process cannot give itself) is the donor's mode.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from types import ModuleType
from typing import Any

SHARING = "GPU_OFFLOAD_GPU_SHARING"
ISOLATION = "GPU_OFFLOAD_GPU_ISOLATION"
MEMORY_LIMIT = "GPU_OFFLOAD_GPU_MEMORY_LIMIT"
FRACTION = "GPU_OFFLOAD_GPU_FRACTION"
MPS_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
"""Set in a container by NVIDIA's device plugin when it lends MPS shares (its Allocate answer), never otherwise."""
MIB = 2**20
ISOLATION_OF = {"time-slicing": "none", "mps": "compute and memory"}
"""The isolation of each way of lending shares of a GPU (``sharing.ISOLATION`` of the origin; a test keeps both
equal)."""


def number(text: str | None) -> float | None:
    """A positive number from the environment, or None (missing, not a number, zero or less)."""
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def memory_fraction(environ: Mapping[str, str], total: int) -> float | None:
    """The share of a GPU of ``total`` bytes the runner may use: its byte limit over the total, else the
    fraction it was given; None when it holds the whole GPU."""
    limit = number(environ.get(MEMORY_LIMIT))
    if limit is not None and total > 0:
        return min(1.0, limit / total)
    fraction = number(environ.get(FRACTION))
    return min(1.0, fraction) if fraction is not None else None


def settle_mode(environ: MutableMapping[str, str]) -> None:
    """The mode of the donor the pod landed on, where the origin could not know it.

    Queued, the pod is created before Kueue picks among donors that lend shares in the same units, and MPS and
    time-slicing shares can be the same resource: the origin wrote the mode of one of them. The device plugin
    tells the container which it got (``CUDA_MPS_PIPE_DIRECTORY`` only under MPS), so the runner's mode and
    isolation are those of the donor it runs on, as the placement notice names them once Kueue admitted it.
    """
    if environ.get(SHARING) in ISOLATION_OF:
        mode = "mps" if environ.get(MPS_PIPE) else "time-slicing"
        environ[SHARING] = mode
        environ[ISOLATION] = ISOLATION_OF[mode]


def set_mps_limit(environ: MutableMapping[str, str]) -> None:
    """Under MPS, the pinned memory limit of device 0 (the one GPU a share is of), unless the pod has one."""
    limit = number(environ.get(MEMORY_LIMIT))
    if environ.get(SHARING) == "mps" and limit is not None and MPS_LIMIT not in environ:
        environ[MPS_LIMIT] = f"0={int(limit) // MIB}M"


def cap_torch(torch: Any, environ: Mapping[str, str]) -> float | None:
    """Set torch's per-process fraction of device 0; the fraction set, or None (no GPU, or a whole GPU)."""
    if not torch.cuda.is_available():
        return None
    fraction = memory_fraction(environ, int(torch.cuda.get_device_properties(0).total_memory))
    if fraction is None or fraction >= 1.0:
        return None
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return fraction


def measured_peak() -> int | None:
    """``torch.cuda.max_memory_allocated`` of GPU 0 when the cells imported torch and a GPU is there; None
    otherwise (torch is never imported for this)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_allocated(0))
    except Exception:  # a broken CUDA state must not cost the run its done frame
        return None


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Applies the cap right after ``torch`` is first imported, then steps aside."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        environ = self.environ

        def exec_module(module: ModuleType) -> None:
            original(module)
            try:
                cap_torch(module, environ)
            except Exception as exc:  # a cap that fails must not fail the cell's import; say so instead
                print(f"gpu-offload: could not cap torch's GPU memory ({exc})", file=sys.stderr)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def holds_part(environ: Mapping[str, str]) -> bool:
    """Whether the runner was told it holds part of a GPU (a byte limit or a fraction)."""
    return number(environ.get(MEMORY_LIMIT)) is not None or number(environ.get(FRACTION)) is not None


def install(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set up the cap for this process; whether there is one to apply (the runner holds part of a GPU)."""
    env = os.environ if environ is None else environ
    if not holds_part(env):
        return False
    settle_mode(env)
    set_mps_limit(env)
    if "torch" in sys.modules:
        cap_torch(sys.modules["torch"], env)
    else:
        sys.meta_path.insert(0, _AfterTorch(env))
    return True
