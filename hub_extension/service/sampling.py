"""Samples each donor's GPUs (total, free, in use) into the database: what the cluster page charts.

A sample is written when a donor's counts change (the inventory cache wakes the thread, as it wakes the
price recorder) and every ``PERIOD`` regardless, so a quiet inventory still has points over the day and the
week; an unchanged inventory between periods writes nothing, which bounds the table by real changes plus
one row per donor per period. Samples older than ``RETENTION`` are deleted with each periodic round: the
charts look back a week, a day more covers the week's first bucket.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.inventory import Inventory

from ..accounting.store import GpuSample, Store
from .following import InventoryFollower

PERIOD = timedelta(minutes=5)
"""A sample of every donor at least this often."""
RETENTION = timedelta(days=8)
"""How long samples are kept."""

Counts = tuple[int, int, int]
"""(total, free, in use) GPUs of one donor."""


def donor_counts(inventory: Inventory) -> dict[str, Counts]:
    """cluster id -> (total, free, in use) GPUs, counted as the clusters page counts them."""
    return {c.cluster_id: (sum(vn.capacity for vn in c.virtual_nodes), c.gpus_free,
                           sum(vn.in_use for vn in c.virtual_nodes)) for c in inventory.clusters}


class Sampler:
    """Decides what to write: the donors whose counts changed, or every donor once ``PERIOD`` has passed."""

    def __init__(self, store: Store, period: timedelta = PERIOD, retention: timedelta = RETENTION) -> None:
        self.store, self.period, self.retention = store, period, retention
        self._last: dict[str, Counts] = {}
        self._last_all: datetime | None = None

    def sample(self, inventory: Inventory, now: datetime) -> list[GpuSample]:
        """Write the samples due at ``now`` for ``inventory`` and return them."""
        counts = donor_counts(inventory)
        everyone = self._last_all is None or now - self._last_all >= self.period
        due = [GpuSample(now, cid, *c) for cid, c in sorted(counts.items()) if everyone or self._last.get(cid) != c]
        if not due:
            return []
        # the retention's delete goes with the periodic round: once per period is enough for a bound
        self.store.add_samples(due, now - self.retention if everyone else None)
        self._last = counts
        if everyone:
            self._last_all = now
        return due

    def next_due(self, now: datetime) -> float:
        """Seconds until the next periodic sample."""
        if self._last_all is None:
            return 0.0
        return max(0.0, (self._last_all + self.period - now).total_seconds())


class InventorySampler(InventoryFollower):
    """One daemon thread feeding a ``Sampler`` from the inventory cache; ``start()``, then ``close()``."""

    failure = "could not sample the donors' GPUs"  # a gap in the charts is all it costs

    def __init__(self, cache: InventoryCache, store: Store, period: timedelta = PERIOD) -> None:
        super().__init__(cache, "gpu-offload-samples")
        self.sampler = Sampler(store, period)

    def follow(self) -> None:
        """Sample the inventory as it is now (writes only what is due)."""
        self.sampler.sample(self.cache.inventory(timeout=30), datetime.now(timezone.utc))

    def wait(self) -> float:
        """Woken by a change, else when the next periodic sample is due."""
        return min(1.0, self.sampler.next_due(datetime.now(timezone.utc)))
