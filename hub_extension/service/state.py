"""The service's live state: liqo_peering's watch-fed inventory cache plus the hub's own watches and database.

Pages and endpoints read from here without any API request; the runner-pod watch feeds the usage
recorder as pods end.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.client import ApiClient, LiqoClient
from gpu_offload.liqo_peering.inventory import Inventory

from ..accounting.cost import month_of, priced
from ..accounting.store import Store, UsageTotal
from ..accounting.usage import (
    billed_user,
    ended_deleting,
    finished_run,
    holds_meter,
    metered,
    namespace_user,
    seen_running,
)
from ..config import HubConfig
from . import charts, views
from .bodies import Body, BodyCache
from .metrics import HubMetrics
from .operations import ClusterFacts
from .pricing import PriceRecorder
from .queue_page import QueuesView, queues_view
from .queues import QueueController, start_controller
from .sampling import InventorySampler
from .watches import (
    QUEUE_PAGE_KINDS,
    CollectionWatch,
    Obj,
    kueue_objects,
    metered_pods,
    read_namespace,
    release_meter,
    resource_slices,
)

log = logging.getLogger("gpu_offload.hub")


class HubState:
    """Everything the pages show, kept current by watches; ``start()`` before use, ``close()`` after."""

    def __init__(self, config: HubConfig, api_client: ApiClient, store: Store) -> None:
        self.config = config
        self.api_client = api_client
        self.store = store
        # The cache also holds the ForeignClusters the pages show: each kind is watched once.
        self.cache = InventoryCache(LiqoClient(api_client, trust=config.clusters))
        self.slices = resource_slices(api_client)
        self.pods = metered_pods(api_client, self._metered, self._on_pod)
        self.prices = PriceRecorder(self.cache, store)
        self.sampler = InventorySampler(self.cache, store)
        self._namespaces: dict[str, Obj] = {}
        self.bodies = BodyCache()
        self._usage_pages: dict[tuple[int, str, date], tuple[list[UsageTotal], views.CostReport, views.UsageCharts]] = {}
        self.queues: QueueController | None = None
        # the Queues page's objects, watched only with queueing on (without Kueue they do not exist)
        self.kueue: dict[str, CollectionWatch] = (
            {g.kind: kueue_objects(api_client, g) for g in QUEUE_PAGE_KINDS} if config.queueing else {})
        # a scrape before the first list answers an error at once rather than blocking the event loop
        self.metrics = HubMetrics(lambda: self.cache.inventory(timeout=0), per_user=config.metrics_per_user)

    def start(self) -> HubState:
        """Start every watch (the pod watch last: recording needs the inventory's node-to-cluster map)."""
        self.cache.start()
        self.prices.start()
        self.sampler.start()
        self.slices.start()
        self.pods.start()
        for watch in self.kueue.values():
            watch.start()
        self.queues = start_controller(self.cache, self.api_client, self.config.queueing, self.config.clusters,
                                       self.store)
        return self

    def close(self) -> None:
        """Stop the watches and the database pool."""
        if self.queues is not None:
            self.queues.close()
        for watch in (self.pods, self.slices, *self.kueue.values()):
            watch.close()
        self.prices.close()
        self.sampler.close()
        self.cache.close()
        self.store.close()

    def wait_synced(self, timeout: float) -> bool:
        """True once every watch has listed once."""
        return self.cache.wait_synced(timeout) and all(
            w.wait_synced(timeout) for w in (self.slices, self.pods)
        )

    def inventory(self) -> Inventory:
        """The current inventory (rebuilt only after a change)."""
        return self.cache.inventory()

    def _metered(self, pod: Obj) -> bool:
        if not (pod.get("spec") or {}).get("nodeName"):  # the common case, without the inventory
            return metered(pod, ())
        return metered(pod, {vn.name for vn in self.cache.inventory(timeout=60).virtual_nodes})

    def _on_pod(self, event_type: str, pod: Obj) -> None:
        now = datetime.now(timezone.utc)
        try:
            nodes = {vn.name: vn for vn in self.cache.inventory(timeout=60).virtual_nodes}
            running_seen = self._running_seen(pod, event_type, nodes, now)
            run = finished_run(pod, event_type, {name: vn.cluster_id for name, vn in nodes.items()}, now, running_seen,
                               {name: vn.offer() for name, vn in nodes.items()})
            if run is not None:  # the user comes from the namespace, not from what the pod claims
                self.prices.note()  # the price in force now is in the book before the run is priced by it
                run = priced(dataclasses.replace(run, user=billed_user(pod, self._namespace(run.namespace))),
                             self.store.price_book(run.cluster_id, run.node))
            if run is not None and self.store.record_run(run):
                log.info("recorded %.0f GPU-seconds of %s/%s for %s on %s", run.gpu_seconds, run.namespace,
                         run.pod, run.user or "?", run.cluster_id)
                self.metrics.record_run(run.user, run.cluster_id, nodes[run.node].model, run.gpu_seconds, run.phase,
                                        pod, run.cost)
            if run is None and event_type == "DELETED" and running_seen is not None:
                self.store.forget_running(str((pod.get("metadata") or {}).get("uid") or ""))
            # recorded (or nothing to record): the pod may go now; a failure above keeps it held for a retry
            over = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or ended_deleting(pod, now)
            if event_type != "DELETED" and holds_meter(pod) and over:
                release_meter(self.api_client, pod)
        except Exception:  # noqa: BLE001 - one bad pod must not stop metering the others
            log.exception("could not record the usage of pod %s", (pod.get("metadata") or {}).get("name"))

    def _running_seen(self, pod: Obj, event_type: str, nodes: dict[str, Any], now: datetime) -> datetime | None:
        """When the meter first saw the pod Running on a virtual node (noted now if this is the first time)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        on_virtual_node = (pod.get("spec") or {}).get("nodeName") in nodes
        if not uid or not on_virtual_node:
            return None
        if seen_running(pod, event_type, now):
            return self.store.saw_running(uid, now)
        return self.store.running_seen(uid)

    def _namespace(self, name: str) -> Obj | None:
        """The namespace as the API has it (cached: its owner never changes), None once it is gone."""
        if name not in self._namespaces:
            found = read_namespace(self.api_client, name)
            if found is None:
                return None
            self._namespaces[name] = found
        return self._namespaces[name]

    # --- views ---

    def cluster_rows(self) -> list[views.ClusterPageRow]:
        """Rows of the clusters page."""
        return views.cluster_rows(self.inventory(), self.cache.objects("ForeignCluster"), datetime.now(timezone.utc))

    def clusters_body(self) -> Body:
        """``api/admin/clusters`` serialised: rebuilt after a watch event, and each second for the ages."""
        # the generation is read before the rows are built, so the body kept is never older than its key
        key = (self.cache.generation, int(datetime.now(timezone.utc).timestamp()))
        return self.bodies.get("clusters", key, lambda: {"clusters": views.to_json(self.cluster_rows())})

    def inventory_body(self) -> Body:
        """``api/inventory`` serialised (the same for every user): rebuilt only after a watch event."""
        key = self.cache.generation
        return self.bodies.get("inventory", key, lambda: views.user_inventory(self.inventory()))

    def cluster_detail(self, key: str) -> views.ClusterDetail | None:
        """The one-cluster page, or None for an unknown cluster."""
        return views.cluster_detail(
            self.inventory(), key, self.cache.objects("ForeignCluster"), self.slices.objects(), self.pods.objects(),
            datetime.now(timezone.utc),
        )

    def donor_charts(self, cluster_id: str) -> views.DonorCharts:
        """The cluster page's charts of one donor's GPUs."""
        return donor_charts(self.store, cluster_id, datetime.now(timezone.utc))

    def user_runs(self, user: str) -> dict[str, Any]:
        """A user's live runs (from the pod watch), finished runs with usage and cost (from the database), and
        what they spent this month against their budget (what the kernel checks before a launch)."""
        now = datetime.now(timezone.utc)
        live = [views.pod_row(p, now) for p in self.pods.objects()
                if views.pod_user(p) == user and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        month = month_of(now)
        return {
            "user": user,
            "running": views.to_json(live),
            "finished": [{**views.to_json(r), "gpu_seconds": r.gpu_seconds} for r in self.store.runs(user)],
            "usage": views.to_json(self.store.totals(user)),
            "this_month": views.month_spend(self.store.spend(user, month), self.config.monthly_budget_per_user),
            "gpu_hours_per_day": views.chart_data(my_usage_chart(self.store, user, now.date())),
        }

    def my_usage(self, user: str) -> views.MyUsage:
        """``user``'s own page (``my_usage``)."""
        return my_usage(self.store, user, self.config.monthly_budget_per_user, datetime.now(timezone.utc))

    def cost_report(self, month: str | None) -> views.CostReport:
        """Cost per user and donor of ``month`` (None: all months), and per month."""
        return views.CostReport(month, tuple(self.store.costs("user", month)), tuple(self.store.costs("donor", month)),
                                tuple(self.store.costs("month")))

    def usage_page(self, month: str) -> tuple[list[UsageTotal], views.CostReport, views.UsageCharts]:
        """The users page's records: all-time totals, ``month``'s cost report, the charts. Kept until a run is
        recorded (or the day changes): reading a month of runs is what the page costs, not rendering it."""
        today = datetime.now(timezone.utc).date()
        key = (self.store.generation, month, today)
        cached = self._usage_pages.get(key)
        if cached is None:
            cached = (self.store.totals(), self.cost_report(month), usage_charts(self.store, month, today))
            self._usage_pages = {key: cached}  # one month at a time: the one being looked at
        return cached

    def queues_view(self) -> QueuesView:
        """The Queues page: Kueue's ClusterQueue, flavors, priority classes and Workloads, from the watches."""
        def objects(kind: str) -> list[Obj]:
            watch = self.kueue.get(kind)
            return watch.objects() if watch is not None else []

        def user_of(namespace: str) -> str:
            try:
                return namespace_user(self._namespace(namespace)) or namespace
            except Exception:  # noqa: BLE001 - a namespace that cannot be read shows as itself
                return namespace
        errors = "; ".join(f"{w.what}: {w.last_error}" for w in self.kueue.values() if w.last_error)
        return queues_view(self.config.queueing, objects("ClusterQueue"), objects("ResourceFlavor"),
                           objects("WorkloadPriorityClass"), objects("Workload"), user_of,
                           datetime.now(timezone.utc), errors)

    def consumer_cluster_id(self) -> str:
        """This cluster's Liqo id: configured, else read from any existing ResourceSlice."""
        if self.config.cluster_id:
            return self.config.cluster_id
        for obj in self.slices.objects():
            found = (obj.get("spec") or {}).get("consumerClusterID")
            if found:
                return str(found)
        return ""

    def facts(self) -> ClusterFacts:
        """What actions must respect right now: this cluster's id, each peer's authentication state."""
        authentication = {}
        for fc in self.cache.objects("ForeignCluster"):
            cluster_id = str((fc.get("spec") or {}).get("clusterID") or fc["metadata"]["name"])
            authentication[cluster_id] = dict(views.module_states(fc))["authentication"]
        return ClusterFacts(self.consumer_cluster_id(), authentication)


DAY_BUCKETS, WEEK_BUCKETS = 24, 28
"""The last day in hours, the last week in quarters of a day."""


def donor_charts(store: Store, cluster_id: str, now: datetime) -> views.DonorCharts:
    """GPUs in use and free of one donor over the day and the week before ``now``, from the samples."""
    day = charts.buckets(now, timedelta(days=1), DAY_BUCKETS)
    week = charts.buckets(now, timedelta(days=7), WEEK_BUCKETS)
    samples = store.samples(cluster_id, week[0])
    return views.DonorCharts(
        charts.gpus_over_time("GPUs in use and free, last day (hourly means, UTC)", samples, day, "%H:%M"),
        charts.gpus_over_time("GPUs in use and free, last week (6-hour means, UTC)", samples, week, "%m-%d %H"),
    )


def my_usage_chart(store: Store, user: str, today: date) -> charts.Chart:
    """``user``'s own GPU-hours per day up to ``today``, stacked by donor: the chart of ``api/me``."""
    days = charts.days_ending(today)
    since = datetime.combine(days[0], time(), timezone.utc)
    chart = charts.stacked_days(f"Your GPU-hours per day by donor, last {len(days)} days (UTC)", days,
                                charts.daily_series(store.daily("donor", since, user), days))
    return dataclasses.replace(chart, empty=chart.empty and (
        f"{chart.empty} Put %%gpu_offload on top of a notebook cell to run it on a remote GPU; its GPU-hours "
        "show here once it ends."))


def my_usage(store: Store, user: str, budget: float | None, now: datetime, runs: int = 20) -> views.MyUsage:
    """``user``'s own page: this month's spend and ``budget``, their chart, their last ``runs`` runs (all read
    with ``user`` as the key: nothing of anyone else's)."""
    return views.MyUsage(store.spend(user, month_of(now)), budget, my_usage_chart(store, user, now.date()),
                         tuple(store.runs(user, runs)))


def usage_charts(store: Store, month: str, today: date) -> views.UsageCharts:
    """GPU-hours per day by user and by donor up to ``today``, and the top users of ``month`` by cost."""
    days = charts.days_ending(today)
    since = datetime.combine(days[0], time(), timezone.utc)
    return views.UsageCharts(
        charts.stacked_days(f"GPU-hours per day by user, last {len(days)} days (UTC)", days,
                            charts.daily_series(store.daily("user", since), days)),
        charts.stacked_days(f"GPU-hours per day by donor, last {len(days)} days (UTC)", days,
                            charts.daily_series(store.daily("donor", since), days)),
        charts.top_costs(f"Top users by cost in {month}", store.costs("user", month)),
    )
