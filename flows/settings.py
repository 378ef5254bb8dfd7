"""Placement settings from Metaflow-style configuration: ``METAFLOW_GPU_OFFLOAD_*`` environment variables or
the same keys in Metaflow's config file (``~/.metaflowconfig/config.json``), read through Metaflow's own
lookup so the usual precedence applies (environment, local config, global config).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .errors import GpuOffloadFlowError

Source = Literal["auto", "live", "config"]
SOURCES: tuple[Source, ...] = ("auto", "live", "config")
Backend = Literal["kubernetes", "local"]
BACKENDS: tuple[Backend, ...] = ("kubernetes", "local")

# Keys without the METAFLOW_ prefix, as Metaflow's from_conf wants them.
CLUSTER = "GPU_OFFLOAD_CLUSTER"
GPU_MODEL = "GPU_OFFLOAD_GPU_MODEL"
NAMESPACE = "GPU_OFFLOAD_NAMESPACE"
INVENTORY = "GPU_OFFLOAD_INVENTORY"
PLACEMENT_SOURCE = "GPU_OFFLOAD_PLACEMENT_SOURCE"
BACKEND = "GPU_OFFLOAD_BACKEND"
POLICY = "GPU_OFFLOAD_PLACEMENT_POLICY"
POLICY_NAMES = ("most-free", "bin-pack", "first-fit")
"""liqo_peering's placement policies by name, spelled out: the step's pod reads settings without that module
(the code package carries only what the pod needs; a test keeps the two lists equal)."""
RECORDED = "GPU_OFFLOAD_PLACEMENT"
"""Set by the extension itself (through ``@environment``) so a step's pod reuses the decision."""
RECORDED_ENV = "METAFLOW_" + RECORDED


@dataclass(frozen=True)
class OffloadSettings:
    """Defaults for every ``@gpu_offload`` step of a deployment."""

    cluster: str | None = None
    """Cluster used when a step says ``cluster="auto"`` (``METAFLOW_GPU_OFFLOAD_CLUSTER``)."""
    gpu_model: str | None = None
    """Model used when a step names none (``METAFLOW_GPU_OFFLOAD_GPU_MODEL``)."""
    namespace: str | None = None
    """Offloaded namespace the step pods go to unless ``@kubernetes(namespace=...)`` says otherwise."""
    inventory: str | None = None
    """Path of an inventory JSON file: clusters and GPUs known offline, for checks without a cluster."""
    source: Source = "auto"
    """``live``: ask the cluster, fail if unreachable; ``config``: never ask; ``auto``: ask, fall back."""
    backend: Backend = "kubernetes"
    """``local`` leaves ``@gpu_offload`` steps as written: they run in the local process (CPU without a GPU)."""
    policy: str = "most-free"
    """Placement policy by name (``METAFLOW_GPU_OFFLOAD_PLACEMENT_POLICY``): most-free, bin-pack, first-fit."""


def _clean(value: object) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text or None


def _choice(lookup: Callable[[str], object], key: str, allowed: tuple[str, ...]) -> str:
    value = _clean(lookup(key)) or allowed[0]
    if value not in allowed:
        raise GpuOffloadFlowError(f"METAFLOW_{key}={value!r} is not allowed; use one of {', '.join(allowed)}")
    return value


def read_settings(lookup: Callable[[str], object]) -> OffloadSettings:
    """Settings from ``lookup(key)`` (Metaflow's ``from_conf`` in production, a dict's ``get`` in tests)."""
    source = _choice(lookup, PLACEMENT_SOURCE, SOURCES)
    backend = _choice(lookup, BACKEND, BACKENDS)
    policy = _choice(lookup, POLICY, POLICY_NAMES)
    return OffloadSettings(
        cluster=_clean(lookup(CLUSTER)),
        gpu_model=_clean(lookup(GPU_MODEL)),
        namespace=_clean(lookup(NAMESPACE)),
        inventory=_clean(lookup(INVENTORY)),
        source=source,  # type: ignore[arg-type]  # one of SOURCES
        backend=backend,  # type: ignore[arg-type]  # one of BACKENDS
        policy=policy,
    )


def metaflow_settings() -> OffloadSettings:
    """Settings as Metaflow's configuration lookup sees them right now."""
    from metaflow.metaflow_config_funcs import from_conf

    return read_settings(from_conf)
