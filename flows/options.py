"""The arguments of ``@gpu_offload``, checked once at the edge and frozen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import GpuOffloadFlowError

AUTO = "auto"
ARGUMENTS = ("gpus", "gpu_model", "cluster", "untrusted_ok", "priority", "gpu_memory")


@dataclass(frozen=True)
class OffloadOptions:
    """What one step asks for with ``@gpu_offload(gpus=1, gpu_model=None, cluster="auto", untrusted_ok=False,
    priority=None)``."""

    gpus: int = 1
    """Whole number of GPUs, 1 or more."""
    gpu_model: str | None = None
    """GPU model as admins label virtual nodes (``gpu-offload.io/gpu-model``), or None for any model."""
    fallback_models: tuple[str, ...] = ()
    """Models to take, in order, when ``gpu_model`` has no room (``gpu_model=["A100", "H100"]``)."""
    cluster: str = AUTO
    """A peered cluster's id or ForeignCluster name, or ``auto`` to let placement choose."""
    untrusted_ok: bool = False
    """Allow clusters the origin does not trust. Off by default: Metaflow's artifacts are pickles, which the
    step's pod writes and later steps and the notebook load, so a donor's admins could run code there."""
    priority: str | None = None
    """Kueue WorkloadPriorityClass of the step's Job when steps queue through Kueue (``batch``, say); None:
    the deployment's default."""
    fraction: float | None = None
    """Part of one GPU (``gpus=0.5``; ``gpus`` is then 1), or None (docs/sharing.md)."""
    gpu_memory: int | None = None
    """Bytes of one GPU's memory the step needs (``gpu_memory="12Gi"``), or None."""

    @property
    def part(self) -> bool:
        """Whether the step asks for part of one GPU rather than whole GPUs."""
        return self.fraction is not None or self.gpu_memory is not None

    def describe(self) -> str:
        """The decorator as the user would write it, for error messages."""
        parts = [f"gpus={self.fraction if self.fraction is not None else self.gpus}"]
        if self.gpu_memory is not None:
            parts.append(f"gpu_memory={self.gpu_memory / 2**30:g}Gi")
        if self.gpu_model and self.fallback_models:
            parts.append(f"gpu_model={[self.gpu_model, *self.fallback_models]!r}")
        elif self.gpu_model:
            parts.append(f"gpu_model={self.gpu_model!r}")
        if self.cluster != AUTO:
            parts.append(f"cluster={self.cluster!r}")
        if self.untrusted_ok:
            parts.append("untrusted_ok=True")
        if self.priority:
            parts.append(f"priority={self.priority!r}")
        return f"@gpu_offload({', '.join(parts)})"


def _gpus(step: str, value: Any) -> int | float:
    # `--with gpu_offload:gpus=2` arrives already converted by Metaflow's spec parser; a str that still looks
    # like a number is accepted for config-driven decorators, anything else is refused.
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and 0 < value < 1:
        return value  # part of one GPU (docs/sharing.md)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GpuOffloadFlowError(
            f"step '{step}': @gpu_offload(gpus={value!r}) is not a whole number of GPUs; "
            "use an integer of 1 or more, e.g. @gpu_offload(gpus=1)"
        )
    return value


def _flag(step: str, name: str, value: Any) -> bool:
    # `--with gpu_offload:untrusted_ok=True` arrives as a bool from Metaflow's spec parser; config text too
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise GpuOffloadFlowError(f"step '{step}': @gpu_offload({name}={value!r}) must be True or False")
    return value


def _text(step: str, name: str, value: Any, example: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise GpuOffloadFlowError(
            f"step '{step}': @gpu_offload({name}={value!r}) must be a non-empty string, e.g. {example}"
        )
    return value.strip()


def _memory(step: str, value: Any) -> int | None:
    """``gpu_memory``: a Kubernetes memory quantity (``"12Gi"``) in bytes, or None."""
    if value is None:
        return None
    from kubernetes.utils import parse_quantity

    try:
        size = int(parse_quantity(str(value)))
    except ValueError:
        size = 0
    if size <= 0:
        raise GpuOffloadFlowError(f"step '{step}': @gpu_offload(gpu_memory={value!r}) is not a size; write e.g. "
                                  "gpu_memory='12Gi'")
    return size


def _models(step: str, value: Any) -> tuple[str, ...]:
    """``gpu_model``: one model, or a list of them in the order placement should try them."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise GpuOffloadFlowError(f"step '{step}': @gpu_offload(gpu_model=[]) names no model; leave it out "
                                      "for any model, or write gpu_model=['A100', 'H100']")
        return tuple(str(_text(step, "gpu_model", v, "gpu_model=['A100', 'H100']")) for v in value)
    model = _text(step, "gpu_model", value, "gpu_model='A100' or gpu_model=['A100', 'H100']")
    return (model,) if model else ()


def parse_options(step: str, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]) -> OffloadOptions:
    """Check the decorator's arguments for ``step`` and return them frozen; raises naming the bad one."""
    if args:
        raise GpuOffloadFlowError(
            f"step '{step}': @gpu_offload takes keyword arguments only (got {list(args)!r}); "
            "write @gpu_offload(gpus=1)"
        )
    unknown = sorted(set(kwargs) - set(ARGUMENTS))
    if unknown:
        raise GpuOffloadFlowError(
            f"step '{step}': @gpu_offload has no argument {', '.join(unknown)}; "
            f"it takes {', '.join(ARGUMENTS)} (other pod settings go on @kubernetes)"
        )
    cluster = _text(step, "cluster", kwargs.get("cluster", AUTO), "cluster='auto'") or AUTO
    models = _models(step, kwargs.get("gpu_model"))
    gpus = _gpus(step, kwargs.get("gpus", 1))
    memory = _memory(step, kwargs.get("gpu_memory"))
    if memory is not None and gpus != 1:
        raise GpuOffloadFlowError(f"step '{step}': @gpu_offload(gpus={gpus!r}, gpu_memory=...) mixes a part of "
                                  "a GPU with another count; gpu_memory asks for part of one GPU: leave gpus out")
    return OffloadOptions(
        gpus=1 if isinstance(gpus, float) else gpus,
        fraction=gpus if isinstance(gpus, float) else None,
        gpu_memory=memory,
        gpu_model=models[0] if models else None,
        fallback_models=models[1:],
        cluster=cluster,
        untrusted_ok=_flag(step, "untrusted_ok", kwargs.get("untrusted_ok", False)),
        priority=_text(step, "priority", kwargs.get("priority"), "priority='batch'"),
    )
