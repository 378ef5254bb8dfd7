"""The monthly budget: what this user spent this month, read from the hub service, and the refusal of a cell
that would start past the budget. The figures are the hub meter's (``api/me``), the budget is the chart's
(``GPU_OFFLOAD_MONTHLY_BUDGET``, which the spawner writes).

Checked before a pod is created, never after: a running cell (or an open session) goes on whatever it
costs. When the hub service cannot be asked, the cell is refused too (the budget could not be checked),
with the cause and the next step: a budget that lets cells through whenever the service restarts would not
hold, and a refused cell costs nothing and can be run again a minute later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ....liqo_peering import environment as E
from ...errors import OffloadUsageError
from .hub_inventory import HubInventoryError, HubReader

TTL_SECONDS = 30.0
"""How long one answer serves the panel and ``%gpu_offload status`` (a launch always asks again)."""


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


def refusal(spend: MonthSpend, budget: float) -> str | None:
    """Why a new pod may not start under ``budget``, or None when it may."""
    if spend.cost < budget:
        return None
    return (f"Your monthly GPU budget is spent: your runs in {spend.month} (UTC) cost {spend.cost:.2f} "
            f"({spend.gpu_hours:.2f} GPU-hours) and the limit is {budget:g}. Nothing was launched; runs and sessions "
            "already running go on. Run the cell on this machine with --backend local, wait for next month, or "
            "ask your JupyterHub admin to raise offload.monthlyBudgetPerUser.")


class HubSpend(HubReader[MonthSpend]):
    """Reads this user's spend from the hub service (``api/me``) with the server's token."""

    path = "/api/me"
    what = "your GPU spend"
    fix = "ask your JupyterHub admin to update the gpu-offload service (one older than budgets says no spend)"
    ttl = TTL_SECONDS

    def parse(self, data: Any) -> MonthSpend:
        return parse_me(data)

    def read(self, timeout: float = 10.0, fresh: bool = False) -> MonthSpend:
        """This month's spend; ``fresh`` asks the hub even when a recent answer is cached."""
        return self.get(timeout, fresh)


@dataclass(frozen=True)
class SpendReading:
    """What a launch learned of the user's spend: the hub's answer, or why there is none."""

    spend: MonthSpend | None = None
    problem: str = ""
    """Why it could not be read: the hub service did not answer, or said something else."""
    no_hub: bool = False
    """No hub service is configured to ask."""


def read_spend(budget: float | None, hub: HubSpend | None) -> SpendReading | None:
    """This month's spend, read afresh for a launch under ``budget``; None when there is no budget to check."""
    if budget is None:
        return None
    if hub is None:
        return SpendReading(no_hub=True)
    try:
        return SpendReading(hub.read(fresh=True))
    except HubInventoryError as exc:
        return SpendReading(problem=str(exc))


def budget_refusal(budget: float | None, reading: SpendReading | None) -> str | None:
    """Why a launch may not start under ``budget`` (None: no budget) given what :func:`read_spend` found, or
    None when it may."""
    if budget is None:
        return None
    if reading is None or reading.no_hub:
        return (f"{E.MONTHLY_BUDGET.name} is set but {E.SERVICE_URL.name} is not, so what you spent cannot be read. "
                f"Nothing was launched. A hub sets both; outside a hub unset {E.MONTHLY_BUDGET.name}.")
    if reading.spend is None:
        return (f"Your monthly GPU budget ({budget:g}) could not be checked: {reading.problem}. Nothing was "
                "launched; try again in a minute (the service may be restarting).")
    return refusal(reading.spend, budget)


def check_budget(budget: float | None, hub: HubSpend | None) -> None:
    """Refuse a launch past ``budget`` (None: no budget) before anything is created."""
    refused = budget_refusal(budget, read_spend(budget, hub))
    if refused:
        raise OffloadUsageError(refused)
