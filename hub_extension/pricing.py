"""Keeps the price book current: notes each virtual node's price whenever the inventory changes.

The inventory already carries the price the origin trusts (``liqo_peering/trust.py``: the admin's chart
value, else the node's label), so the book records what placement and the pages show. One daemon thread,
woken by the inventory cache's changes like the queue controller, so a price change is noted when the
watch delivers it, not on a clock.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.inventory import Inventory

from .store import Store

log = logging.getLogger("gpu_offload.hub")


def node_prices(inventory: Inventory) -> dict[tuple[str, str], float | None]:
    """(cluster id, virtual node) -> price per GPU-hour (None: unpriced)."""
    return {(vn.cluster_id, vn.name): vn.price for vn in inventory.virtual_nodes}


class PriceRecorder:
    """One daemon thread noting price changes into the store; ``start()``, then ``close()``."""

    def __init__(self, cache: InventoryCache, store: Store) -> None:
        self.cache, self.store = cache, store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-offload-prices", daemon=True)

    def start(self) -> PriceRecorder:
        """Start the thread."""
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait briefly for it."""
        self._stop.set()
        self._thread.join(timeout)

    def note(self, timeout: float = 30.0) -> int:
        """Note the current prices now (also called before a run is priced); how many changed."""
        return self.store.note_prices(node_prices(self.cache.inventory(timeout=timeout)), datetime.now(timezone.utc))

    def _run(self) -> None:
        generation = -1
        while not self._stop.is_set():
            # short waits so close() is prompt; a change wakes it at once
            generation = self.cache.wait_changed(generation, 1.0)
            try:
                self.note()
            except Exception as exc:  # noqa: BLE001 - the recorder outlives any one failure; runs note prices too
                log.warning("could not note donors' prices: %s", exc)
                self._stop.wait(5.0)
