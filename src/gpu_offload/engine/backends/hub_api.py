"""The hub service's user-scoped API, read with the user server's token: ``api/inventory`` (the donors a
cluster backend places on in a hub deployment) and ``api/me`` (what the user spent this month).

``HubReader`` reads one endpoint (cached for a few seconds); ``HubSpend`` is ``api/me``'s and the kube
backend's ``HubInventory`` is ``api/inventory``'s. Not a backend: the kubernetes backend reads both through it (its inventory source and the monthly budget), and
the panel reads the spend through it too, also in a kernel that starts no cluster backend (a hub that sets the
service's URL and no namespace). Standard library only: no cluster client is loaded for it.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import OffloadError

TTL_SECONDS = 5.0
"""How long one answer serves by default: cells in quick succession cost one request to the hub, not one each."""
SPEND_TTL_SECONDS = 30.0
"""How long one answer of ``api/me`` serves the panel and ``%gpu_offload status`` (a launch always asks again)."""


class HubInventoryError(OffloadError):
    """The hub service did not answer (with an inventory, or with the spend); the message names the URL and the
    next step."""


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


@dataclass(frozen=True)
class MonthSpend:
    """What the user's finished runs of one month cost, as the hub recorded them."""

    month: str
    runs: int
    gpu_hours: float
    cost: float
    unpriced_runs: int
    budget: float | None
    """The hub's budget for the user (the chart's); the kernel's own setting decides the check."""


def _number(raw: Any, name: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ValueError(f"this_month.{name}={raw!r} is not a number")
    return float(raw)


def parse_me(data: Any) -> MonthSpend:
    """The ``this_month`` part of ``api/me``; ValueError naming the field that does not fit."""
    month = data.get("this_month") if isinstance(data, Mapping) else None
    if not isinstance(month, Mapping):
        raise ValueError("the answer has no this_month (a hub service older than budgets?)")
    budget = month.get("budget")
    return MonthSpend(str(month.get("month") or "?"), int(_number(month.get("runs", 0), "runs")),
                      _number(month.get("gpu_hours"), "gpu_hours"), _number(month.get("cost"), "cost"),
                      int(_number(month.get("unpriced_runs", 0), "unpriced_runs")),
                      None if budget is None else _number(budget, "budget"))


def spend_line(spend: MonthSpend, budget: float | None) -> str:
    """One line for ``%gpu_offload status`` and the panel."""
    line = f"GPU usage in {spend.month} (UTC): {spend.gpu_hours:.2f} GPU-hours, cost {spend.cost:.2f}"
    if budget is not None:
        line += f" of a monthly budget of {budget:g}"
    if spend.unpriced_runs:
        line += f" ({spend.unpriced_runs} run(s) without a price)"
    return line


class HubSpend(HubReader[MonthSpend]):
    """Reads this user's spend from the hub service (``api/me``) with the server's token."""

    path = "/api/me"
    what = "your GPU spend"
    fix = "ask your JupyterHub admin to update the gpu-offload service (one older than budgets says no spend)"
    ttl = SPEND_TTL_SECONDS

    def parse(self, data: Any) -> MonthSpend:
        return parse_me(data)

    def read(self, timeout: float = 10.0, fresh: bool = False) -> MonthSpend:
        """This month's spend; ``fresh`` asks the hub even when a recent answer is cached."""
        return self.get(timeout, fresh)

    def line(self, budget: float | None, timeout: float = 5.0) -> str:
        """This month's spend in one line (:func:`spend_line`), or why it is not known now: what
        ``%gpu_offload status`` and the panel show."""
        try:
            return spend_line(self.read(timeout=timeout), budget)
        except HubInventoryError as exc:
            return f"GPU usage this month is not known now: {exc}"
