"""The inventory inside a hub deployment: users hold no cluster-wide read rights, so the records come from
the hub service's user-scoped API (``GET <GPU_OFFLOAD_SERVICE_URL>/api/inventory``), and placement runs on
them with the same ``liqo_peering`` code as with a kubeconfig of one's own."""

from __future__ import annotations

import threading
import time

from ....liqo_peering.inventory import Inventory, inventory_from_dict
from ..hub_api import HubInventoryError, get_json

TTL_SECONDS = 5.0
"""How long one answer serves: cells in quick succession cost one request to the hub, not one each."""


class HubInventory:
    """Reads the inventory from the hub service with the user server's API token, cached for a few seconds."""

    def __init__(self, service_url: str, token: str, ttl: float = TTL_SECONDS) -> None:
        self.url = service_url.rstrip("/") + "/api/inventory"
        self._token = token
        self._ttl = ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, Inventory] | None = None
        self.requests = 0

    def inventory(self, timeout: float = 10.0) -> Inventory:
        """The inventory, read again when the last answer is older than the TTL."""
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < self._ttl:
                return self._cached[1]
            self.requests += 1
            data = get_json(self.url, self._token, timeout, "the inventory")
            try:
                inventory = inventory_from_dict(data["records"])
            except (ValueError, KeyError, TypeError) as exc:
                raise HubInventoryError(
                    f"no inventory from the hub service at {self.url} ({exc}); check that the gpu-offload service "
                    "runs (ask your JupyterHub admin), or unset GPU_OFFLOAD_SERVICE_URL to read the cluster directly"
                ) from exc
            self._cached = (time.monotonic(), inventory)
            return inventory

    def close(self, timeout: float = 0.0) -> None:
        """Nothing to stop (no watch threads); present so the backend treats both sources alike."""
