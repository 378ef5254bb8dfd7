"""Placement from the live cluster: the inventory read through the official Kubernetes client.

Asked only where the flow is validated, never inside a step's pod (the decision is recorded by then).
``auto`` asks only when a kubeconfig (or in-cluster credentials) exists and falls back to configuration
when the API server does not answer; ``live`` makes an unreachable cluster an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .cluster_reader import IN_CLUSTER
from .errors import GpuOffloadFlowError
from .settings import OffloadSettings

if TYPE_CHECKING:
    from gpu_offload.liqo_peering.inventory import Inventory

_CACHE: dict[str, Inventory | None] = {}
_QUEUES: dict[tuple[str, str], str | None] = {}


def kubeconfig_path() -> str | None:
    """The kubeconfig the client would load, or None when there is none (and no in-cluster account)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return IN_CLUSTER
    for candidate in os.environ.get("KUBECONFIG", "").split(os.pathsep):
        if candidate and Path(candidate).is_file():
            return candidate
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def live_inventory(settings: OffloadSettings) -> Inventory | None:
    """The cluster's inventory, once per process; None when ``auto`` finds no cluster to ask."""
    where = kubeconfig_path()
    if where is None:
        if settings.source == "live":
            raise GpuOffloadFlowError(
                "METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE=live but no kubeconfig was found; set KUBECONFIG "
                "or use METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE=config"
            )
        return None
    if where not in _CACHE:
        _CACHE[where] = _fetch(where, settings)
    return _CACHE[where]


def live_queue(settings: OffloadSettings) -> str | None:
    """The one LocalQueue of the step pods' namespace, once per process, when no setting names a queue: found
    as a kernel finds its own. None when placement does not ask the cluster (``config``, or ``auto`` without
    a cluster that answers), or the namespace has none."""
    if settings.source == "config":
        return None
    where = kubeconfig_path()
    if where is None:
        return None  # `live` without a kubeconfig is refused by live_inventory, with the fix
    key = (where, target_namespace(settings))
    if key not in _QUEUES:
        from .cluster_reader import ClusterUnreachable, read_local_queue

        try:
            _QUEUES[key] = read_local_queue(*key)
        except ClusterUnreachable:
            if settings.source == "live":
                raise
            _QUEUES[key] = None
            _CACHE.setdefault(where, None)  # `auto` falls back to configuration without asking again
    return _QUEUES[key]


def target_namespace(settings: OffloadSettings) -> str:
    """Where step pods go: the configured offloaded namespace, else Metaflow's Kubernetes namespace."""
    from metaflow.metaflow_config import KUBERNETES_NAMESPACE

    return settings.namespace or str(KUBERNETES_NAMESPACE or "default")


def _fetch(where: str, settings: OffloadSettings) -> Inventory | None:
    from .cluster_reader import ClusterUnreachable, read_inventory

    try:
        return read_inventory(where, target_namespace(settings))
    except ClusterUnreachable:
        if settings.source == "live":
            raise
        # `auto`: a kubeconfig for a cluster that is off (a laptop, CI) is normal; configuration decides.
        return None
