"""The clusters view: the local backend as one row, then each donor cluster's GPUs (pure row builders and
the small readers that fetch an inventory from wherever this kernel may read it)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...engine.backends import registry
from ...liqo_peering.inventory import Inventory
from ...liqo_peering.settings import read_kernel

LOCAL = "local"
NO_CLUSTER = (
    "No cluster is configured, so cells run on this machine (the local row). To add one: inside JupyterHub "
    "the admin enables the gpu-offload service (it sets GPU_OFFLOAD_NAMESPACE and GPU_OFFLOAD_SERVICE_URL "
    "for your server); with a kubeconfig of your own, set GPU_OFFLOAD_NAMESPACE to your offloaded namespace "
    "(and KUBECONFIG) before starting the kernel, or try `gpu-offload sandbox` for an emulated origin."
)


@dataclass(frozen=True)
class ClusterEntry:
    """One row of the clusters view; choosing it sets where the next ``%%gpu_offload`` cells run."""

    key: str
    """``local`` or the remote cluster id (what ``--cluster`` takes)."""
    name: str
    backend: str
    model: str
    free: int | None
    total: int | None
    price: float | None
    """Cheapest price of one GPU-hour on the cluster; ``None`` when the admin set none."""
    health: str
    note: str = ""
    trusted: bool = False
    """The origin trusts what runs there send back (this machine always; a donor only when an admin said so)."""


def local_row(gpu_names: list[str]) -> ClusterEntry:
    """The embedded local backend: this machine's GPUs (CPU only when it has none)."""
    model = ", ".join(sorted(set(gpu_names))) if gpu_names else "CPU only"
    count = len(gpu_names)
    return ClusterEntry(LOCAL, "this machine", LOCAL, model, count, count, None, "healthy",
                        "" if gpu_names else "no GPU here: cells run on CPU", trusted=True)


def inventory_rows(inventory: Inventory) -> list[ClusterEntry]:
    """One row per peered cluster, from liqo_peering's records."""
    rows = []
    for cluster in inventory.clusters:
        usable = [vn for vn in cluster.virtual_nodes if vn.ready and not vn.cordoned]
        prices = [vn.price for vn in usable if vn.price is not None]
        models = sorted({vn.model for vn in cluster.virtual_nodes if vn.model})
        rows.append(ClusterEntry(
            cluster.cluster_id, cluster.name, "kubernetes", ", ".join(models) or "unlabelled",
            cluster.gpus_free, sum(vn.allocatable for vn in usable), min(prices) if prices else None,
            cluster.health, cluster.reason, trusted=cluster.trusted,
        ))
    return rows


def hub_rows(data: Mapping[str, Any]) -> list[ClusterEntry]:
    """Rows from the hub service's user-scoped inventory (clusters with free GPUs and models; prices by model)."""
    prices: Mapping[str, float] = data.get("price_per_gpu_hour_by_model") or {}
    rows = []
    for raw in data.get("clusters") or []:
        models = list(raw.get("models") or [])
        known = [prices[m] for m in models if m in prices]
        rows.append(ClusterEntry(
            str(raw["cluster_id"]), str(raw.get("name") or raw["cluster_id"]), "kubernetes",
            ", ".join(models) or "unlabelled", int(raw.get("gpus_free") or 0), None,
            min(known) if known else None, str(raw.get("health") or "unknown"), trusted=raw.get("trusted") is True,
        ))
    return rows


def local_gpu_names() -> list[str]:
    """Names of this machine's NVIDIA GPUs through NVML; none when there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver or no library: a machine without GPUs
        return []
    try:
        names = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    finally:
        pynvml.nvmlShutdown()


def read_hub_inventory(env: Mapping[str, str], timeout: float = 10.0) -> dict[str, Any]:
    """The hub service's user-scoped inventory, with the user server's token."""
    url = (read_kernel(env).service_url or "").rstrip("/") + "/api/inventory"
    request = urllib.request.Request(url, headers={"Authorization": f"token {env.get('JUPYTERHUB_API_TOKEN', '')}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the hub's own URL
        return dict(json.loads(response.read()))


def cluster_source(env: Mapping[str, str] | None = None) -> str:
    """Where this kernel reads the inventory: ``hub``, ``kubernetes`` or ``none``."""
    env = os.environ if env is None else env
    if read_kernel(env).service_url:
        return "hub"
    return "kubernetes" if registry.cluster_configured(env) else "none"
