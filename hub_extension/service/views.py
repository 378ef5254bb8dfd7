"""What the admin pages and the JSON API show, built from watched objects and the inventory. Pure.

The HTML pages and the JSON endpoints render the same view records, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.inventory import (
    ClusterRecord,
    Inventory,
    VirtualNodeRecord,
    inventory_to_dict,
    pod_gpus,
)
from gpu_offload.liqo_peering.timestamps import parse_time

from ..accounting.cost import month_of
from ..accounting.store import CostRow
from ..accounting.usage import MeteredRun, pod_user
from .charts import Chart

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class ClusterPageRow:
    """One peered cluster on the clusters page."""

    cluster_id: str
    name: str
    role: str
    health: str
    reason: str
    modules: tuple[tuple[str, str], ...]
    """(module, state) for networking, authentication, offloading: ``ok``, ``disabled`` or the bad conditions."""
    age_seconds: float | None
    gpus_total: int
    gpus_free: int
    gpus_in_use: int
    price: float | None
    """Cheapest priced virtual node of the cluster, per GPU-hour."""
    virtual_nodes: int
    cordoned: int
    """How many of its virtual nodes are cordoned."""
    trusted: bool = False
    """Whether the origin's configuration trusts it (never what the donor's labels say): docs/security.md."""


@dataclass(frozen=True)
class SliceRow:
    """One ResourceSlice towards a cluster: what was asked and what the provider granted."""

    namespace: str
    name: str
    requested_gpus: str
    granted_gpus: str
    conditions: str


@dataclass(frozen=True)
class PodRow:
    """One offloaded pod running (or just finished) on a cluster."""

    namespace: str
    name: str
    user: str
    node: str
    gpus: int
    phase: str
    age_seconds: float | None


@dataclass(frozen=True)
class ClusterDetail:
    """The one-cluster page."""

    row: ClusterPageRow
    virtual_nodes: tuple[VirtualNodeRecord, ...]
    slices: tuple[SliceRow, ...]
    pods: tuple[PodRow, ...]


def module_states(fc: Obj | None) -> tuple[tuple[str, str], ...]:
    """(module, state) of a ForeignCluster's networking, authentication and offloading modules."""
    modules = ((fc or {}).get("status") or {}).get("modules") or {}
    states = []
    for module in ("networking", "authentication", "offloading"):
        spec = modules.get(module) or {}
        if not spec.get("enabled", False):
            states.append((module, "disabled"))
            continue
        bad = [f"{c.get('type')}={c.get('status')}" for c in spec.get("conditions") or []
               if c.get("status") not in ("Established", "Ready")]
        states.append((module, ", ".join(bad) if bad else "ok"))
    return tuple(states)


def _age(obj: Obj | None, now: datetime) -> float | None:
    created = parse_time(((obj or {}).get("metadata") or {}).get("creationTimestamp"))
    return None if created is None else (now - created).total_seconds()


def cluster_row(cluster: ClusterRecord, fc: Obj | None, now: datetime) -> ClusterPageRow:
    """The row of one cluster; ``fc`` is its ForeignCluster (None when the peering is gone)."""
    vns = cluster.virtual_nodes
    prices = [vn.price for vn in vns if vn.price is not None]
    return ClusterPageRow(
        cluster_id=cluster.cluster_id, name=cluster.name, role=cluster.role, health=cluster.health,
        reason=cluster.reason, modules=module_states(fc), age_seconds=_age(fc, now),
        gpus_total=sum(vn.capacity for vn in vns), gpus_free=cluster.gpus_free,
        gpus_in_use=sum(vn.in_use for vn in vns), price=min(prices) if prices else None,
        virtual_nodes=len(vns), cordoned=sum(1 for vn in vns if vn.cordoned), trusted=cluster.trusted,
    )


def _fc_by_cluster(foreign_clusters: Iterable[Obj]) -> dict[str, Obj]:
    return {str((fc.get("spec") or {}).get("clusterID") or fc["metadata"]["name"]): fc for fc in foreign_clusters}


def cluster_rows(inventory: Inventory, foreign_clusters: Iterable[Obj], now: datetime) -> list[ClusterPageRow]:
    """Every peered cluster, in the inventory's order."""
    fcs = _fc_by_cluster(foreign_clusters)
    return [cluster_row(c, fcs.get(c.cluster_id), now) for c in inventory.clusters]


def slice_row(obj: Obj) -> SliceRow:
    """A ResourceSlice as the page shows it."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = ", ".join(f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or [])
    return SliceRow(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        requested_gpus=str(((obj.get("spec") or {}).get("resources") or {}).get(L.GPU_RESOURCE, "0")),
        granted_gpus=str((status.get("resources") or {}).get(L.GPU_RESOURCE, "-")),
        conditions=conditions or "not granted yet",
    )


def pod_row(pod: Obj, now: datetime) -> PodRow:
    """A runner pod as the page shows it."""
    meta = pod.get("metadata") or {}
    return PodRow(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), user=pod_user(pod),
        node=str((pod.get("spec") or {}).get("nodeName") or ""), gpus=pod_gpus(pod),
        phase=str((pod.get("status") or {}).get("phase") or "Pending"), age_seconds=_age(pod, now),
    )


def cluster_detail(
    inventory: Inventory, key: str, foreign_clusters: Iterable[Obj], slices: Iterable[Obj], pods: Iterable[Obj],
    now: datetime,
) -> ClusterDetail | None:
    """The page of the cluster whose id or name is ``key``; None when no such cluster is peered."""
    cluster = inventory.cluster(key)
    if cluster is None:
        return None
    fc = _fc_by_cluster(foreign_clusters).get(cluster.cluster_id)
    nodes = {vn.name for vn in cluster.virtual_nodes}
    mine = [s for s in slices
            if ((s.get("spec") or {}).get("providerClusterID") == cluster.cluster_id)]
    return ClusterDetail(
        row=cluster_row(cluster, fc, now),
        virtual_nodes=cluster.virtual_nodes,
        slices=tuple(sorted((slice_row(s) for s in mine), key=lambda r: (r.namespace, r.name))),
        pods=tuple(sorted((pod_row(p, now) for p in pods if (p.get("spec") or {}).get("nodeName") in nodes),
                          key=lambda r: (r.namespace, r.name))),
    )


@dataclass(frozen=True)
class ModelSupply:
    """Free GPUs of one model over usable virtual nodes (clusters not down, nodes ready and not cordoned)."""

    model: str
    free: int
    clusters: tuple[str, ...]
    """Clusters with at least one free GPU of this model."""
    cheapest: float | None
    """Lowest price per GPU-hour among the nodes offering it; None when none is priced."""


def supply_by_model(inventory: Inventory) -> list[ModelSupply]:
    """Per GPU model (``unlabelled`` for nodes without one): what a new run could get right now."""
    free: dict[str, int] = {}
    clusters: dict[str, set[str]] = {}
    prices: dict[str, float] = {}
    for cluster in inventory.clusters:
        if cluster.health == "down":
            continue
        for vn in cluster.virtual_nodes:
            if vn.cordoned or not vn.ready:
                continue
            model = vn.model or "unlabelled"
            free[model] = free.get(model, 0) + vn.free
            if vn.free:
                clusters.setdefault(model, set()).add(cluster.cluster_id)
            if vn.price is not None:
                prices[model] = min(prices.get(model, vn.price), vn.price)
    return [ModelSupply(m, n, tuple(sorted(clusters.get(m, ()))), prices.get(m)) for m, n in sorted(free.items())]


def user_inventory(inventory: Inventory) -> dict[str, Any]:
    """The inventory any hub user may see: clusters, free GPUs by model, prices (no other users' runs)."""
    supply = supply_by_model(inventory)
    clusters = [{"cluster_id": c.cluster_id, "name": c.name, "health": c.health, "gpus_free": c.gpus_free,
                 "trusted": c.trusted, "models": sorted({vn.model for vn in c.virtual_nodes if vn.model})}
                for c in inventory.clusters]
    # "records": the full inventory records, so the kernel runs placement with liqo_peering's own code
    return {"clusters": clusters, "free_gpus_by_model": {s.model: s.free for s in supply},
            "price_per_gpu_hour_by_model": {s.model: s.cheapest for s in supply if s.cheapest is not None},
            "records": inventory_to_dict(inventory)}


def to_json(value: Any) -> Any:
    """A view record (or a sequence of them) as JSON-ready data."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [to_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value


def month_spend(spent: CostRow, budget: float | None) -> dict[str, Any]:
    """What a user spent in one month, and their budget (None: none), as ``api/me`` answers it."""
    return {"month": spent.key, "runs": spent.runs, "gpu_hours": spent.gpu_hours, "cost": spent.cost,
            "unpriced_runs": spent.unpriced_runs, "budget": budget,
            "remaining": None if budget is None else max(0.0, budget - spent.cost)}


@dataclass(frozen=True)
class CostReport:
    """Cost per user and per donor of one month (or of all months), and per month: the cost page and API."""

    month: str | None
    """``YYYY-MM`` (UTC) the user and donor rows cover; None: all months."""
    by_user: tuple[CostRow, ...]
    by_donor: tuple[CostRow, ...]
    by_month: tuple[CostRow, ...]
    """Every month with runs, newest first (whatever ``month`` is)."""


def this_month(now: datetime | None = None) -> str:
    """The current billing month, ``YYYY-MM`` in UTC."""
    return month_of(now or datetime.now(timezone.utc))


@dataclass(frozen=True)
class UsageCharts:
    """The users page's charts (charts.py draws them)."""

    per_day_by_user: Chart
    per_day_by_donor: Chart
    top_users: Chart


def chart_data(chart: Chart) -> dict[str, Any]:
    """A chart as JSON: its title, each bar's series, category (a day) and value, and what to say when empty."""
    return {"title": chart.title, "bars": [{"series": b.series, "category": b.category, "value": b.value}
                                           for b in chart.bars], "empty": chart.empty}


@dataclass(frozen=True)
class MyUsage:
    """A user's own page: what they spent this month, their GPU-hours per day by donor, their last runs."""

    spent: CostRow
    budget: float | None
    chart: Chart
    runs: tuple[MeteredRun, ...]
    """Their most recent finished runs, newest first."""

    @property
    def remaining(self) -> float | None:
        """What is left of the budget (None: no budget)."""
        return None if self.budget is None else max(0.0, self.budget - self.spent.cost)


@dataclass(frozen=True)
class DonorCharts:
    """The cluster page's charts: its GPUs in use and free over the last day and the last week."""

    last_day: Chart
    last_week: Chart
