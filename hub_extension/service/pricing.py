"""Keeps the price book current: notes each virtual node's price whenever the inventory changes.

The inventory already carries the price the origin trusts (``liqo_peering/trust.py``: the admin's chart
value, else the node's label), so the book records what placement and the pages show. One daemon thread,
woken by the inventory cache's changes like the queue controller, so a price change is noted when the
watch delivers it, not on a clock.
"""

from __future__ import annotations

from datetime import datetime, timezone

from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.inventory import Inventory

from ..accounting.store import Store
from .following import InventoryFollower


def node_prices(inventory: Inventory) -> dict[tuple[str, str], float | None]:
    """(cluster id, virtual node) -> price per GPU-hour (None: unpriced)."""
    return {(vn.cluster_id, vn.name): vn.price for vn in inventory.virtual_nodes}


class PriceRecorder(InventoryFollower):
    """One daemon thread noting price changes into the store; ``start()``, then ``close()``."""

    failure = "could not note donors' prices"  # runs note prices too, so a failure here loses nothing

    def __init__(self, cache: InventoryCache, store: Store) -> None:
        super().__init__(cache, "gpu-offload-prices")
        self.store = store

    def note(self, timeout: float = 30.0) -> int:
        """Note the current prices now (also called before a run is priced); how many changed."""
        return self.store.note_prices(node_prices(self.cache.inventory(timeout=timeout)), datetime.now(timezone.utc))

    def follow(self) -> None:
        """Note the prices of the inventory as it is now."""
        self.note()
