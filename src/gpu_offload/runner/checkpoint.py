"""A session's state as a checkpoint: what pickles, a record of what did not and why, by the trust rules.

A shared pool takes GPUs back (preemption, a drained donor, idle release), and a session's state lives only
in its runner. A checkpoint is the runner's namespace written out so a new runner elsewhere can go on:

- on a **trusted** donor, one cloudpickle (protocol 5) of every variable that pickles, together, so shared
  objects stay shared (an optimizer still holds its model's very parameters); functions and classes defined
  in earlier cells travel by value, as cloudpickle does for ``__main__``. CUDA tensors are written as CPU
  copies that go back to the same device on restore where one exists (else they stay on the CPU);
- on an **untrusted** donor, the safe format (``safe``): data only (arrays, tensors, plain values); nothing a
  donor wrote is ever unpickled, here or in the kernel. The kernel reads it with the safe decoders and sends
  the values to the next runner as ordinary inputs.

Modules are recorded by name and imported again on a trusted restore. Names that cannot be saved (open files,
sockets, threads, locks, generators, CUDA state beyond tensors) are listed with the reason, so the user is
told what did not survive. A checkpoint larger than its limit is refused whole, saying the size, rather than
written in part. Standard library plus cloudpickle: this module runs inside the runner's zipapp.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
from dataclasses import dataclass
from typing import Any

from . import buffers, safe

PICKLE = "pickle"
SAFE = "safe"
FORMATS = (PICKLE, SAFE)
DEFAULT_LIMIT = 2 * 2**30
"""Bytes a checkpoint may take unless the hub or the user says otherwise (shown to the user)."""
_RUNNER_NAMES = frozenset({"display", "In", "Out", "get_ipython", "exit", "quit"})


class CheckpointTooLarge(RuntimeError):
    """The state is larger than the checkpoint limit; nothing was written."""


@dataclass(frozen=True)
class Checkpoint:
    """A written checkpoint: its bytes, and the manifest that says what is in it."""

    data: bytes
    manifest: dict[str, Any]

    @property
    def sha256(self) -> str:
        return str(self.manifest["sha256"])


def _restore_device(tensor: Any, device: str, parameter: bool, requires_grad: bool) -> Any:
    """Unpickling side of a CUDA tensor: back on its device where there is one, else on the CPU."""
    torch = sys.modules.get("torch")
    if torch is not None and device.startswith("cuda") and torch.cuda.is_available():
        tensor = tensor.to(device)
    if parameter and torch is not None:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor


class HoldsProcessGroup(TypeError):
    """A value holds a ``torch.distributed`` process group (a ``DistributedDataParallel`` wrapper, a
    ``ProcessGroup``, a ``DTensor``'s mesh...): its communicators live in the ranks' processes and cannot be
    written out. Refused while pickling, nested values included: such a value would pickle (DDP's own
    ``__getstate__`` drops its group) and then fail to unpickle without a group, taking the whole checkpoint."""


PROCESS_GROUP = ("holds a torch.distributed process group, which does not outlive the ranks' processes: after "
                 "the resume call dist.init_process_group() and wrap the module again (keep the module in a "
                 "variable of its own, e.g. model = ddp.module, so it is saved)")
_GROUP_MODULES = ("torch.distributed", "torch._C._distributed", "torch.nn.parallel.distributed")


_GROUP_KINDS: dict[type, bool] = {}


def _holds_group(kind: type) -> bool:
    held = _GROUP_KINDS.get(kind)
    if held is None:  # once per type: the reducer sees every object of the state
        held = _GROUP_KINDS[kind] = any((getattr(k, "__module__", "") or "").startswith(_GROUP_MODULES)
                                        for k in kind.__mro__)
    return held


def _cuda_to_cpu_keep_device(obj: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:  # nothing holds a CUDA tensor or a process group without torch imported
        return NotImplemented
    if _holds_group(type(obj)):
        raise HoldsProcessGroup(PROCESS_GROUP)
    if not isinstance(obj, torch.Tensor) or not getattr(obj, "is_cuda", False):
        return NotImplemented
    parameter = isinstance(obj, torch.nn.Parameter)
    return _restore_device, (obj.detach().cpu(), str(obj.device), parameter, bool(obj.requires_grad))


def state_names(namespace: dict[str, Any]) -> list[str]:
    """The user's variables: names the cells made, not the runner's own nor IPython's underscore history."""
    return sorted(n for n in namespace if not n.startswith("_") and n not in _RUNNER_NAMES)


def _reason(value: Any, exc: BaseException) -> str:
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def take(namespace: dict[str, Any], fmt: str = PICKLE, limit: int = DEFAULT_LIMIT, *,
         written_on: str = "", trusted: bool = False) -> Checkpoint:
    """Write the state of ``namespace`` in ``fmt``; raise :class:`CheckpointTooLarge` above ``limit`` bytes."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown checkpoint format {fmt!r}; use one of {', '.join(FORMATS)}")
    modules: dict[str, str] = {}
    values: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in state_names(namespace):
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        elif fmt == PICKLE:
            problem = buffers.pickling_error(value, _cuda_to_cpu_keep_device)
            if problem is None:
                values[name] = value
            else:
                skipped[name] = _reason(value, problem)
        else:
            values[name] = value
    if fmt == PICKLE:
        data = buffers.dump(values, "inline", reducer=_cuda_to_cpu_keep_device).pickle
        saved = sorted(values)
    else:
        encoded = safe.encode(values)
        for skip in encoded.skipped:
            skipped[skip.name] = f"{skip.type}: {skip.reason} (an untrusted donor's checkpoint holds data only)"
        data = encoded.tobytes()
        saved = sorted(set(values) - {s.name for s in encoded.skipped})
    if len(data) > limit:
        raise CheckpointTooLarge(
            f"the session's state is {len(data) / 2**20:.1f} MiB, over the checkpoint limit of "
            f"{limit / 2**20:.0f} MiB; nothing was written. Delete large variables you can rebuild (del x), "
            "or raise the limit (%gpu_offload checkpoint SESSION --limit MIB --auto on)"
        )
    manifest = {
        "version": 1,
        "format": fmt,
        "saved": saved,
        "modules": modules,
        "skipped": skipped,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "written_on": written_on,
        "trusted": bool(trusted) and fmt == PICKLE,
    }
    return Checkpoint(data, manifest)


class CheckpointRefused(ValueError):
    """A checkpoint that must not be restored the way it was asked for; the message says why."""


def verify(data: bytes, manifest: dict[str, Any]) -> None:
    """Refuse a checkpoint whose bytes are not the ones its manifest describes (storage is untrusted too)."""
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise CheckpointRefused("the checkpoint's bytes do not match its recorded sha256: it was changed in "
                                "storage; it cannot be restored, start the session afresh")


def restore_trusted(data: bytes, manifest: dict[str, Any], *, target_trusted: bool) -> dict[str, Any]:
    """Unpickle a trusted checkpoint for a runner on a trusted donor; anything else is refused."""
    verify(data, manifest)
    if manifest.get("format") != PICKLE or manifest.get("trusted") is not True:
        raise CheckpointRefused(
            "this checkpoint was written on a donor the origin does not trust: it is restored as data only "
            "(the kernel decodes it safely), never unpickled"
        )
    if not target_trusted:
        raise CheckpointRefused("a full checkpoint is restored only onto a trusted donor; move the session to "
                                "one (--trusted-only), or restore its data only")
    import importlib

    state = dict(buffers.load(data, []))
    for name, module in manifest.get("modules", {}).items():
        try:
            state[name] = importlib.import_module(str(module))
        except ImportError as exc:
            manifest.setdefault("skipped", {})[name] = f"module {module}: {exc}"
    return state


def describe(manifest: dict[str, Any]) -> str:
    """One line for the user: what the checkpoint holds and what did not survive."""
    saved = ", ".join(manifest.get("saved", [])) or "nothing"
    text = f"checkpoint {manifest.get('size', 0) / 2**20:.1f} MiB ({manifest.get('format')}): {saved}"
    if manifest.get("modules"):
        text += f"; modules {', '.join(sorted(manifest['modules']))}"
    skipped = manifest.get("skipped") or {}
    if skipped:
        text += "; not saved: " + "; ".join(f"{k} ({v})" for k, v in sorted(skipped.items()))
    return text


def manifest_json(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, sort_keys=True)
