"""Placement settings from Metaflow-style configuration: ``METAFLOW_GPU_OFFLOAD_*`` environment variables or
the same keys in Metaflow's config file (``~/.metaflowconfig/config.json``), read through Metaflow's own
lookup so the usual precedence applies (environment, local config, global config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

# The step's pod imports these from the code package, which carries liqo_peering's environment and settings
# modules (flows/packaging.py) but not its placement or client.
from gpu_offload.liqo_peering import environment as E
from gpu_offload.liqo_peering.settings import FlowBackend as Backend
from gpu_offload.liqo_peering.settings import FlowSettings, Source, read_flow, recorded_decision

from .errors import GpuOffloadFlowError

__all__ = ["RECORDED_ENV", "Backend", "OffloadSettings", "Source", "metaflow_settings", "read_settings",
           "recorded_decision"]

RECORDED_ENV = E.RECORDED_PLACEMENT.name
"""Set by the extension itself (through ``@environment``) so a step's pod reuses the decision."""

OffloadSettings = FlowSettings
"""Defaults for every ``@gpu_offload`` step of a deployment, read by the one settings module."""


def read_settings(lookup: Callable[[str], object], kernel_env: Mapping[str, str] | None = None) -> OffloadSettings:
    """Settings from ``lookup(key)`` (Metaflow's ``from_conf`` in production, a dict's ``get`` in tests); the
    queue and priority fall back to the run defaults the hub's spawner set for the user's server
    (``kernel_env``), so a flow run from a notebook's terminal queues like its cells."""
    try:
        return read_flow(lookup, kernel_env)
    except E.InvalidSetting as exc:
        raise GpuOffloadFlowError(str(exc)) from None


def metaflow_settings() -> OffloadSettings:
    """Settings as Metaflow's configuration lookup sees them right now."""
    import os

    from metaflow.metaflow_config_funcs import from_conf

    return read_settings(from_conf, os.environ)
