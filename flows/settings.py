"""Placement settings from Metaflow-style configuration: ``METAFLOW_GPU_OFFLOAD_*`` environment variables or
the same keys in Metaflow's config file (``~/.metaflowconfig/config.json``), read through Metaflow's own
lookup so the usual precedence applies (environment, local config, global config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, cast

# The step's pod imports this from the code package, which carries liqo_peering's environment module
# (flows/packaging.py) but not its placement or client.
from gpu_offload.liqo_peering import environment as E

from .errors import GpuOffloadFlowError

Source = Literal["auto", "live", "config"]
Backend = Literal["kubernetes", "local"]

RECORDED_ENV = E.RECORDED_PLACEMENT.name
"""Set by the extension itself (through ``@environment``) so a step's pod reuses the decision."""


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
    queue: str | None = None
    """Kueue LocalQueue of the step Jobs (``METAFLOW_GPU_OFFLOAD_QUEUE``, else the hub's ``GPU_OFFLOAD_QUEUE``);
    None: the namespace's one LocalQueue where placement asks the cluster (``mutation.with_found_queue``), else
    no queueing."""
    priority: str | None = None
    """Kueue priority class of steps that name none (``METAFLOW_GPU_OFFLOAD_PRIORITY``, else the hub's
    ``GPU_OFFLOAD_PRIORITY``)."""


def read_settings(lookup: Callable[[str], object], kernel_env: Mapping[str, str] | None = None) -> OffloadSettings:
    """Settings from ``lookup(key)`` (Metaflow's ``from_conf`` in production, a dict's ``get`` in tests); the
    queue and priority fall back to what the hub's spawner set for the user's server (``kernel_env``), so a
    flow run from a notebook's terminal queues like its cells."""
    kernel_env = kernel_env or {}
    try:
        return OffloadSettings(
            cluster=E.FLOW_CLUSTER.get(lookup),
            gpu_model=E.FLOW_GPU_MODEL.get(lookup),
            namespace=E.FLOW_NAMESPACE.get(lookup),
            inventory=E.FLOW_INVENTORY.get(lookup),
            source=cast(Source, E.FLOW_SOURCE.get(lookup)),
            backend=cast(Backend, E.FLOW_BACKEND.get(lookup)),
            policy=E.FLOW_POLICY.get(lookup),
            queue=E.FLOW_QUEUE.get(lookup) or E.QUEUE.read(kernel_env),
            priority=E.FLOW_PRIORITY.get(lookup) or E.PRIORITY.read(kernel_env),
        )
    except E.InvalidSetting as exc:
        raise GpuOffloadFlowError(str(exc)) from None


def metaflow_settings() -> OffloadSettings:
    """Settings as Metaflow's configuration lookup sees them right now."""
    import os

    from metaflow.metaflow_config_funcs import from_conf

    return read_settings(from_conf, os.environ)
