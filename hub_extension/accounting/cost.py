"""What a run cost: its GPU-hours priced with the donor's price as it was while the run ran. Pure: no I/O.

The service keeps a price book: each time a virtual node's price (the origin admin's ``clusters.<id>.
pricePerGpuHour``, else the node's label; ``liqo_peering/trust.py`` decides) differs from the last one it
wrote down, it notes the new price and since when. A finished run is priced against that book, so a later
change never rewrites what an earlier run cost.

A run that spans a change is priced piecewise: each stretch of the run at the price in force then. The
price in force at a moment is the last one noted at or before it; before the first note of a node (a run
that began before the service first saw the node) the first noted price applies. Time at no price (an
unpriced node) costs nothing. A run belongs to the month (UTC) in which it ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from .usage import MeteredRun


@dataclass(frozen=True)
class PricePoint:
    """From ``since`` on (until the next point), one GPU-hour on the node cost ``price`` (None: unpriced)."""

    since: datetime
    price: float | None


@dataclass(frozen=True)
class Stretch:
    """Part of a run at one price."""

    start: datetime
    end: datetime
    price: float | None


@dataclass(frozen=True)
class Priced:
    """A run's cost, and the price per GPU-hour it works out at (cost / GPU-hours; the one price when the run
    saw one). Both None when no stretch of the run was priced."""

    cost: float | None
    price_per_gpu_hour: float | None


def stretches(book: Sequence[PricePoint], started: datetime, ended: datetime) -> list[Stretch]:
    """The run ``started``..``ended`` cut at each price change in ``book`` (points in any order)."""
    points = sorted(book, key=lambda p: p.since)
    if not points:
        return [Stretch(started, ended, None)]
    current = points[0].price  # before the first note: the first price the service saw
    for point in points:
        if point.since <= started:
            current = point.price
    cuts = [Stretch(started, ended, current)]
    for point in points:
        if started < point.since < ended:
            last = cuts.pop()
            cuts += [Stretch(last.start, point.since, last.price), Stretch(point.since, ended, point.price)]
    return cuts


def price_run(book: Sequence[PricePoint], gpus: float, started: datetime, ended: datetime) -> Priced:
    """The cost of ``gpus`` GPUs (or part of one) held from ``started`` to ``ended`` under the price ``book``."""
    pieces = stretches(book, started, ended)
    priced = [s for s in pieces if s.price is not None]
    if not priced:
        return Priced(None, None)
    cost = sum(gpus * (s.end - s.start).total_seconds() / 3600 * (s.price or 0.0) for s in priced)
    hours = gpus * max(0.0, (ended - started).total_seconds()) / 3600
    if len({s.price for s in pieces}) == 1:
        return Priced(cost, priced[0].price)
    return Priced(cost, cost / hours if hours else priced[-1].price)


def priced(run: MeteredRun, book: Sequence[PricePoint]) -> MeteredRun:
    """``run`` with its price and cost under the node's price ``book``."""
    found = price_run(book, run.held, run.started, run.ended)
    return dataclasses.replace(run, price_per_gpu_hour=found.price_per_gpu_hour, cost=found.cost)


def month_of(moment: datetime) -> str:
    """The billing month of a run that ended at ``moment``: ``YYYY-MM`` in UTC."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return aware.astimezone(timezone.utc).strftime("%Y-%m")
