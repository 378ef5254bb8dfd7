"""The inventory inside a hub deployment: users hold no cluster-wide read rights, so the records come from
the hub service's user-scoped API (``GET <GPU_OFFLOAD_SERVICE_URL>/api/inventory``), and placement runs on
them with the same ``liqo_peering`` code as with a kubeconfig of one's own."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Generic, TypeVar

from ....liqo_peering.inventory import Inventory, inventory_from_dict
from ...errors import OffloadError

TTL_SECONDS = 5.0
"""How long one answer serves: cells in quick succession cost one request to the hub, not one each."""


class HubInventoryError(OffloadError):
    """The hub service did not answer with an inventory; the message names the URL and the next step."""


def get_json(url: str, token: str, timeout: float, what: str) -> Any:
    """GET ``url`` of the hub service with the user server's token; a ``HubInventoryError`` naming ``what``
    was asked, the URL and the next step when there is no JSON answer."""
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the hub's own URL
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise HubInventoryError(
            f"the hub service refused {what} ({url}: HTTP {exc.code}); restart your server from the hub (its token "
            "may have expired) or ask your JupyterHub admin") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HubInventoryError(
            f"no {what} from the hub service at {url} ({exc}); check that the gpu-offload service runs (ask your "
            "JupyterHub admin)") from exc


Answer = TypeVar("Answer")


class HubReader(Generic[Answer]):
    """One user-scoped endpoint of the hub service (``path`` under its URL), read with the user server's API
    token, parsed by :meth:`parse`, and cached for ``ttl`` seconds (a burst of cells costs one request)."""

    path = ""
    what = ""
    """What the endpoint says, as an error names it (``the inventory``)."""
    fix = ""
    """What to do when its answer cannot be read."""
    ttl = TTL_SECONDS

    def __init__(self, service_url: str, token: str, ttl: float | None = None) -> None:
        self.url = service_url.rstrip("/") + self.path
        self._token = token
        if ttl is not None:
            self.ttl = ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, Answer] | None = None
        self.requests = 0

    def parse(self, data: Any) -> Answer:
        """The endpoint's JSON as a record; ValueError, KeyError or TypeError when it does not fit."""
        raise NotImplementedError

    def get(self, timeout: float, fresh: bool = False) -> Answer:
        """The answer, asked again when ``fresh`` or when the last one is older than the TTL."""
        with self._lock:
            if not fresh and self._cached is not None and time.monotonic() - self._cached[0] < self.ttl:
                return self._cached[1]
            self.requests += 1
            data = get_json(self.url, self._token, timeout, self.what)
            try:
                answer = self.parse(data)
            except (ValueError, KeyError, TypeError) as exc:
                raise HubInventoryError(f"the hub service at {self.url} did not answer with {self.what} this "
                                        f"kernel can read ({exc}); {self.fix}") from None
            self._cached = (time.monotonic(), answer)
            return answer


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
