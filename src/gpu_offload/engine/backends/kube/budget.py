"""The monthly budget: what this user spent this month, read from the hub service, and the refusal of a cell
that would start past the budget. The figures are the hub meter's (``api/me``), the budget is the chart's
(``GPU_OFFLOAD_MONTHLY_BUDGET``, which the spawner writes).

Checked before a pod is created, never after: a running cell (or an open session) goes on whatever it
costs. When the hub service cannot be asked, the cell is refused too (the budget could not be checked),
with the cause and the next step: a budget that lets cells through whenever the service restarts would not
hold, and a refused cell costs nothing and can be run again a minute later.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....liqo_peering import environment as E
from ...errors import OffloadUsageError
from ..hub_api import HubInventoryError, HubSpend, MonthSpend


def refusal(spend: MonthSpend, budget: float) -> str | None:
    """Why a new pod may not start under ``budget``, or None when it may."""
    if spend.cost < budget:
        return None
    return (f"Your monthly GPU budget is spent: your runs in {spend.month} (UTC) cost {spend.cost:.2f} "
            f"({spend.gpu_hours:.2f} GPU-hours) and the limit is {budget:g}. Nothing was launched; runs and sessions "
            "already running go on. Run the cell on this machine with --backend local, wait for next month, or "
            "ask your JupyterHub admin to raise offload.monthlyBudgetPerUser.")


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
