"""The hub's queue controller: keeps Kueue's flavors, ClusterQueue and priority classes following the inventory.

It wakes when the watch-fed inventory cache changes (no polling of the API), rebuilds the desired objects
(pure: ``liqo_peering.kueue``) and reconciles only when they differ from what it last applied, so pod
churn costs no API request. Every ``RESYNC_SECONDS`` it reconciles anyway, repairing hand edits. Each
reconcile that writes, conflicts or fails lands in the audit log, like an admin's action.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.kueue import Desired, QueueSettings, desired
from gpu_offload.liqo_peering.queue_sync import QueueApi, reconcile
from gpu_offload.liqo_peering.trust import TrustPolicy

from ..accounting.store import Store
from .following import InventoryFollower

log = logging.getLogger("gpu_offload.hub")
RESYNC_SECONDS = 600.0
"""At most this long between reconciles, changes or not."""
RETRY_SECONDS = 10.0
"""Pause after a failed reconcile before the next try."""
WHO = "gpu-offload queue controller"


class QueueController(InventoryFollower):
    """One daemon thread reconciling Kueue's objects with the inventory; ``start()``, then ``close()``."""

    def __init__(self, cache: InventoryCache, api: QueueApi, settings: QueueSettings, policy: TrustPolicy,
                 store: Store, resync_seconds: float = RESYNC_SECONDS) -> None:
        super().__init__(cache, "gpu-offload-queues")
        self.api, self.settings, self.policy, self.store = api, settings, policy, store
        self.resync_seconds = resync_seconds
        self._applied: Desired | None = None
        self.passes = 0
        """Reconciles made (each lists the Kueue kinds once): what a test or a bench counts."""
        self.generation = -1
        """The inventory cache's generation last looked at."""

    def _run(self) -> None:  # its own loop: it reconciles on a clock as well, and audits its failures
        generation, last = -1, 0.0
        while not self._stop.is_set():
            # short waits so close() is prompt; a change wakes it at once
            generation = self.cache.wait_changed(generation, 1.0)
            due = time.monotonic() - last >= self.resync_seconds
            try:
                wanted = desired(self.cache.inventory(timeout=30), self.policy, self.settings)
                if wanted != self._applied or due:
                    self.step(wanted)
                    last = time.monotonic()
                self.generation = generation
            except Exception as exc:  # noqa: BLE001 - the controller outlives any one failure, the log keeps it
                self._applied = None
                self.store.audit(WHO, "queues-sync", f"ClusterQueue {self.settings.cluster_queue}", str(exc), False)
                log.warning("queue sync failed: %s; retrying in %.0fs", exc, RETRY_SECONDS)
                self._stop.wait(RETRY_SECONDS)

    def step(self, wanted: Desired) -> Any:
        """Reconcile once towards ``wanted`` and audit the outcome when anything was written or refused."""
        self.passes += 1
        result = reconcile(self.api, wanted)
        self._applied = wanted
        if result.changes or result.conflicts or result.warnings:
            ok = not result.conflicts
            self.store.audit(WHO, "queues-sync", f"ClusterQueue {self.settings.cluster_queue}", str(result), ok)
            log.info("queue sync: %s", str(result).replace("\n", "; "))
        return result


def start_controller(cache: InventoryCache, api_client: Any, settings: QueueSettings | None, policy: TrustPolicy,
                     store: Store) -> QueueController | None:
    """The controller over the hub's own credentials when queueing is on, started; None when it is off."""
    if settings is None:
        return None
    from gpu_offload.liqo_peering.queue_client import KueueClient

    return QueueController(cache, KueueClient(api_client), settings, policy, store).start()
