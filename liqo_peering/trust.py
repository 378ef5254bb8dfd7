"""Which peered clusters the origin trusts, and the GPU model and price its admin set for them. Pure.

A donor cluster is a separate trust domain: whoever runs a pod there can write its log and its outputs. So
trust is decided on the origin only, from configuration the origin's admin (or, outside a hub, the user)
wrote: the chart's ``clusters`` values (through the service's ConfigMap, the hub inventory and the user
server's ``GPU_OFFLOAD_TRUSTED_CLUSTERS``), or that variable alone outside a hub. Never from Node or
VirtualNode labels: Liqo copies a donor's own labels onto its virtual node (ResourceSlice
``status.nodeLabels``), so a donor could call itself trusted.

GPU model and price: the origin admin's per-cluster values win over labels, since a label on a virtual
node may have come from the donor through the same copy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .inventory import ClusterRecord, Inventory
from .settings import read_kernel

LOCAL_BACKEND = "local"
"""The backend that runs cells on the user's own machine: always trusted. It is a backend name, never a
cluster id, since a donor chooses its own cluster id and could call itself "local"."""


@dataclass(frozen=True)
class ClusterPolicy:
    """What the origin's admin set for one cluster id."""

    trusted: bool = False
    """Outputs from this cluster may be unpickled and its rich output shown as trusted."""
    gpu_model: str | None = None
    """GPU model to show and place by, overriding the virtual node's label."""
    price_per_gpu_hour: float | None = None
    """Price of one GPU-hour, overriding the virtual node's label."""


@dataclass(frozen=True)
class TrustPolicy:
    """The origin's per-cluster settings; a cluster it does not name is untrusted and keeps its labels."""

    clusters: Mapping[str, ClusterPolicy] = field(default_factory=dict)

    def for_cluster(self, cluster_id: str) -> ClusterPolicy:
        """The settings of ``cluster_id`` (the default: untrusted, no override)."""
        return self.clusters.get(cluster_id) or ClusterPolicy()

    @property
    def trusted_ids(self) -> tuple[str, ...]:
        """The trusted cluster ids, sorted (what the spawner writes into ``GPU_OFFLOAD_TRUSTED_CLUSTERS``)."""
        return tuple(sorted(cid for cid, p in self.clusters.items() if p.trusted))


def is_trusted(cluster_id: str, policy: TrustPolicy) -> bool:
    """Whether the origin trusts the peered cluster ``cluster_id``."""
    return policy.for_cluster(cluster_id).trusted


def run_trusted(backend: str, cluster_id: str, policy: TrustPolicy) -> bool:
    """Whether a run's outputs may be trusted: on the local backend always, else when its cluster is."""
    return backend == LOCAL_BACKEND or is_trusted(cluster_id, policy)


def trusting(cluster_ids: Iterable[str]) -> TrustPolicy:
    """The policy that trusts ``cluster_ids`` and sets nothing else."""
    return TrustPolicy({cid: ClusterPolicy(trusted=True) for cid in cluster_ids})


def policy_from_env(environ: Mapping[str, str]) -> TrustPolicy:
    """The policy ``GPU_OFFLOAD_TRUSTED_CLUSTERS`` (comma-separated cluster ids) gives; empty: none trusted."""
    return trusting(read_kernel(environ).trusted_clusters)


def _price(value: Any, where: str) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where}.pricePerGpuHour={value!r} is not a number; write it like 2.5")
    try:
        price = float(value)
    except ValueError:
        raise ValueError(f"{where}.pricePerGpuHour={value!r} is not a number; write it like 2.5") from None
    if not math.isfinite(price) or price < 0:
        raise ValueError(f"{where}.pricePerGpuHour={value!r} must be a number of 0 or more")
    return price


def policy_from_config(raw: Any, where: str = "clusters") -> TrustPolicy:
    """The policy from the chart's ``clusters`` value: ``{<cluster id>: {trusted, gpuModel, pricePerGpuHour}}``.

    Raises ``ValueError`` naming the entry and key that do not fit.
    """
    if raw is None:
        return TrustPolicy()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must map cluster ids to settings, got {type(raw).__name__}")
    clusters: dict[str, ClusterPolicy] = {}
    for cid, entry in raw.items():
        here = f"{where}.{cid}"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{here} must be a mapping like {{trusted: true}}, got {entry!r}")
        unknown = sorted(set(entry) - {"trusted", "gpuModel", "pricePerGpuHour"})
        if unknown:
            raise ValueError(f"{here}: unknown key(s) {', '.join(map(str, unknown))}; use trusted, gpuModel, "
                             "pricePerGpuHour")
        trusted = entry.get("trusted", False)
        if not isinstance(trusted, bool):
            raise ValueError(f"{here}.trusted={trusted!r} must be true or false")
        model = entry.get("gpuModel")
        if model is not None and not isinstance(model, str):
            raise ValueError(f"{here}.gpuModel={model!r} must be a string like A100")
        clusters[str(cid)] = ClusterPolicy(trusted, model or None, _price(entry.get("pricePerGpuHour"), here))
    return TrustPolicy(clusters)


def _apply_cluster(cluster: ClusterRecord, policy: TrustPolicy) -> ClusterRecord:
    settings = policy.for_cluster(cluster.cluster_id)
    nodes = tuple(
        dataclasses.replace(
            vn,
            model=settings.gpu_model if settings.gpu_model is not None else vn.model,
            price=settings.price_per_gpu_hour if settings.price_per_gpu_hour is not None else vn.price,
        )
        for vn in cluster.virtual_nodes
    )
    return dataclasses.replace(cluster, trusted=is_trusted(cluster.cluster_id, policy), virtual_nodes=nodes)


def apply_policy(inventory: Inventory, policy: TrustPolicy) -> Inventory:
    """The inventory with each cluster's ``trusted`` set from ``policy`` alone (whatever it said before), and
    the admin's GPU model and price in place of the labels' where the admin set them."""
    return dataclasses.replace(inventory, clusters=tuple(_apply_cluster(c, policy) for c in inventory.clusters))
