"""The inventory inside a hub deployment: users hold no cluster-wide read rights, so the records come from
the hub service's user-scoped API (``GET <GPU_OFFLOAD_SERVICE_URL>/api/inventory``), and placement runs on
them with the same ``liqo_peering`` code as with a kubeconfig of one's own."""

from __future__ import annotations

from typing import Any

from ....liqo_peering.inventory import Inventory, inventory_from_dict
from ..hub_api import HubInventoryError, HubReader

__all__ = ["HubInventory", "HubInventoryError"]


class HubInventory(HubReader[Inventory]):
    """Reads the inventory from the hub service with the user server's API token, cached for a few seconds."""

    path = "/api/inventory"
    what = "the inventory"
    fix = ("check that the gpu-offload service runs (ask your JupyterHub admin), or unset GPU_OFFLOAD_SERVICE_URL "
           "to read the cluster directly")

    def parse(self, data: Any) -> Inventory:
        return inventory_from_dict(data["records"])

    def inventory(self, timeout: float = 10.0) -> Inventory:
        """The inventory, read again when the last answer is older than the TTL."""
        return self.get(timeout)

    def close(self, timeout: float = 0.0) -> None:
        """Nothing to stop (no watch threads); present so the backend treats both sources alike."""
