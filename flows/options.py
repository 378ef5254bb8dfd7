"""The arguments of ``@gpu_offload``, checked once at the edge and frozen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import GpuOffloadFlowError

AUTO = "auto"
ARGUMENTS = ("gpus", "gpu_model", "cluster")


@dataclass(frozen=True)
class OffloadOptions:
    """What one step asks for with ``@gpu_offload(gpus=1, gpu_model=None, cluster="auto")``."""

    gpus: int = 1
    """Whole number of GPUs, 1 or more."""
    gpu_model: str | None = None
    """GPU model as admins label virtual nodes (``gpu-offload.io/gpu-model``), or None for any model."""
    cluster: str = AUTO
    """A peered cluster's id or ForeignCluster name, or ``auto`` to let placement choose."""

    def describe(self) -> str:
        """The decorator as the user would write it, for error messages."""
        parts = [f"gpus={self.gpus}"]
        if self.gpu_model:
            parts.append(f"gpu_model={self.gpu_model!r}")
        if self.cluster != AUTO:
            parts.append(f"cluster={self.cluster!r}")
        return f"@gpu_offload({', '.join(parts)})"


def _gpus(step: str, value: Any) -> int:
    # `--with gpu_offload:gpus=2` arrives already converted by Metaflow's spec parser; a str that still looks
    # like a number is accepted for config-driven decorators, anything else is refused.
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GpuOffloadFlowError(
            f"step '{step}': @gpu_offload(gpus={value!r}) is not a whole number of GPUs; "
            "use an integer of 1 or more, e.g. @gpu_offload(gpus=1)"
        )
    return value


def _text(step: str, name: str, value: Any, example: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise GpuOffloadFlowError(
            f"step '{step}': @gpu_offload({name}={value!r}) must be a non-empty string, e.g. {example}"
        )
    return value.strip()


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
    return OffloadOptions(
        gpus=_gpus(step, kwargs.get("gpus", 1)),
        gpu_model=_text(step, "gpu_model", kwargs.get("gpu_model"), "gpu_model='A100'"),
        cluster=cluster,
    )
