"""The service's Prometheus metrics: what a platform team scrapes at ``/metrics``. No I/O here.

Counters (GPU-seconds, runs, failed API requests) are bumped where the event happens; the inventory's gauges (GPUs
per donor and model, donor health) are computed when Prometheus scrapes, from the watch-fed cache, so no
bookkeeping can drift from what the pages show. Each service owns its registry (not prometheus_client's
global one), so several services can run in one process, as the tests do.

Every label value comes from a bounded set: hub users, donors (cluster ids), GPU models, pod phases, the
fixed reasons below and Kubernetes verbs. Run ids and pod names never appear: each would be a new time series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpu_offload.liqo_peering.inventory import Inventory
from gpu_offload.liqo_peering.timestamps import parse_time
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..accounting.usage import preempted

PREFIX = "gpu_offload_"
UNLABELLED_MODEL = "unlabelled"
REASONS = frozenset({
    "Completed", "Error", "OOMKilled", "Evicted", "DeadlineExceeded", "ContainerCannotRun", "Preempting", "Preempted",
    "NodeLost", "Shutdown", "Terminated", "UnexpectedAdmissionError",
})
"""Reasons Kubernetes gives for a pod or container ending; anything else is counted as ``other``."""
VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete"})
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WAIT_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
"""Seconds: a pod bound at once (under a second) to a queue that holds it for hours."""


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def waited_seconds(pod: Mapping[str, Any]) -> float | None:
    """Seconds from the pod's creation until it was bound to a node (its ``PodScheduled`` condition turned
    true); None for a pod never bound. For a pod in a Kueue queue that is its time in the queue (the
    admission gate holds it unscheduled) plus the scheduler's moment; for others it is placement alone."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is None or scheduled.get("status") != "True":
        return None
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    try:
        # the status Liqo reflects from a donor may carry any text here: information only, never an error
        bound = parse_time(scheduled.get("lastTransitionTime"))
    except ValueError:
        return None
    if created is None or bound is None:
        return None
    return max(0.0, (bound - created).total_seconds())


def queued(pod: Mapping[str, Any]) -> bool:
    """Whether the pod went through a Kueue queue (it carries the queue-name label Kueue's webhook reads)."""
    return bool(((pod.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL))


def run_reason(pod: Mapping[str, Any]) -> str:
    """Why a runner pod ended, from a bounded set: the pod's reason (``Evicted``), else its first terminated
    container's (``Completed``, ``OOMKilled``), ``none`` when Kubernetes gave none, ``other`` for the rest."""
    if preempted(pod):  # Kueue deletes the pod: without this it would count as deleted with no reason
        return "Preempted"
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    if not reason:
        for cs in status.get("containerStatuses") or []:
            reason = str(((cs.get("state") or {}).get("terminated") or {}).get("reason") or "")
            if reason:
                break
    if not reason:
        return "none"
    return reason if reason in REASONS else "other"


class InventoryCollector(Collector):
    """GPUs and donor health, read from the inventory at scrape time."""

    def __init__(self, inventory: Callable[[], Inventory]) -> None:
        self._inventory = inventory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inventory = self._inventory()
        labels = ["cluster", "model"]
        capacity = GaugeMetricFamily(f"{PREFIX}gpus", "GPUs the donor lends, per GPU model.", labels=labels)
        free = GaugeMetricFamily(f"{PREFIX}gpus_free", "GPUs a new run could get now (ready, not cordoned).",
                                 labels=labels)
        in_use = GaugeMetricFamily(f"{PREFIX}gpus_in_use", "GPUs held by pods on the donor.", labels=labels)
        healthy = GaugeMetricFamily(f"{PREFIX}donor_healthy", "1 while the donor's peering is healthy, else 0 "
                                    "(degraded or down, from its ForeignCluster's conditions).", labels=["cluster"])
        for cluster in inventory.clusters:
            healthy.add_metric([cluster.cluster_id], 1.0 if cluster.health == "healthy" else 0.0)
            sums: dict[str, list[int]] = {}
            for vn in cluster.virtual_nodes:
                row = sums.setdefault(vn.model or UNLABELLED_MODEL, [0, 0, 0])
                usable = vn.ready and not vn.cordoned  # as the inventory's gpus_free, which the pages show
                row[0] += vn.capacity
                row[1] += vn.free if usable else 0
                row[2] += vn.in_use
            for model, (total, available, used) in sorted(sums.items()):
                capacity.add_metric([cluster.cluster_id, model], total)
                free.add_metric([cluster.cluster_id, model], available)
                in_use.add_metric([cluster.cluster_id, model], used)
        yield from (capacity, free, in_use, healthy)


class HubMetrics:
    """The service's metric families in a registry of their own."""

    def __init__(self, inventory: Callable[[], Inventory], per_user: bool = True) -> None:
        # A <name>_created series per counter and label set doubles what Prometheus stores for nothing the
        # dashboard uses (a process-wide switch of prometheus_client).
        disable_created_metrics()
        self.per_user = per_user
        """The chart's ``metrics.perUserSeries``: False drops the ``user`` label (one series per hub user and
        donor and model adds up on a large hub); the service's pages still show each user."""
        user = ["user"] if per_user else []
        self.registry = CollectorRegistry()
        self.gpu_seconds = Counter(
            f"{PREFIX}gpu_seconds", "GPU-seconds of finished offloaded runs (GPUs times wall time).",
            [*user, "cluster", "model"], registry=self.registry)
        self.cost = Counter(
            f"{PREFIX}cost", "Cost of finished offloaded runs at the donors' prices while they ran (unpriced runs "
            "add nothing).", [*user, "cluster", "model"], registry=self.registry)
        self.runs = Counter(f"{PREFIX}runs", "Finished offloaded runs by outcome (pod phase, or Deleted) and "
                            "reason.", ["outcome", "reason"], registry=self.registry)
        self.api_errors = Counter(f"{PREFIX}api_errors", "Kubernetes API requests of the service's admin actions "
                                  "that failed (no answer, or an error the action could not handle).", ["verb"],
                                  registry=self.registry)
        self.placement = Histogram(
            f"{PREFIX}placement_seconds", "Seconds from a runner pod's creation until it was bound to a virtual "
            "node, for pods outside a Kueue queue (observed when the run ends).", ["cluster"],
            buckets=WAIT_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram(
            f"{PREFIX}queue_wait_seconds", "Seconds a runner pod waited in its Kueue queue until admitted and bound "
            "(observed when the run ends).", ["cluster"], buckets=WAIT_BUCKETS, registry=self.registry)
        self.preemptions = Counter(f"{PREFIX}preemptions", "Runs Kueue preempted for a higher-priority run.",
                                   [*user, "cluster"], registry=self.registry)
        self.registry.register(InventoryCollector(inventory))

    def record_run(self, user: str, cluster: str, model: str | None, gpu_seconds: float, outcome: str,
                   pod: Mapping[str, Any], cost: float | None = None) -> None:
        """Count one newly recorded run (never one seen again: the store says which are new): its GPU-seconds
        and cost, its outcome and reason, how long it waited to be placed or queued, and whether it was
        preempted."""
        who = (user,) if self.per_user else ()
        self.gpu_seconds.labels(*who, cluster, model or UNLABELLED_MODEL).inc(gpu_seconds)
        self.cost.labels(*who, cluster, model or UNLABELLED_MODEL).inc(cost or 0.0)
        reason = run_reason(pod)
        self.runs.labels(outcome, reason).inc()
        waited = waited_seconds(pod)
        if waited is not None:
            (self.queue_wait if queued(pod) else self.placement).labels(cluster).observe(waited)
        if reason == "Preempted":
            self.preemptions.labels(*who, cluster).inc()

    def api_error(self, verb: str) -> None:
        """Count one failed API request; ``verb`` is Kubernetes' (anything else is counted as ``other``)."""
        self.api_errors.labels(verb if verb in VERBS else "other").inc()
