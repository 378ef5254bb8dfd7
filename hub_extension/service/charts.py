"""Charts of the admin pages, drawn on the server as inline SVG (no script, no request to anywhere). Pure.

This module turns usage into geometry (bars with their data); ``templates/gpu_offload_charts.html`` writes the
SVG, so every label reaches the page through the templates' autoescaping. Each bar carries its series, its
category and its value as ``data-`` attributes: what a reader of the page source, and the tests, check
against the database.

Days and months are UTC; a run counts on the day it ended, as it counts in the month it ended (cost.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from ..accounting.store import CostRow, GpuSample

DAYS = 30
"""Days the daily charts cover, today included."""
TOP = 8
"""Series a stacked chart names; the rest are summed as ``OTHER``."""
OTHER = "other"
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
"""Tableau 10: distinguishable in print and for the common colour-vision deficiencies."""
WIDTH, HEIGHT, LEFT, BOTTOM, TOP_MARGIN = 720, 240, 48, 28, 12


@dataclass(frozen=True)
class Bar:
    """One rectangle: ``value`` of ``series`` for ``category`` (a day, or a user)."""

    series: str
    category: str
    value: float
    x: float
    y: float
    width: float
    height: float
    color: str
    text: str
    """The tooltip: the value in words."""


@dataclass(frozen=True)
class Tick:
    """A label along an axis at ``at`` (y for values, x for categories)."""

    at: float
    text: str


@dataclass(frozen=True)
class Chart:
    """What the template draws; ``bars`` empty means there is nothing to show (``empty`` says what to do)."""

    title: str
    width: int
    height: int
    bars: tuple[Bar, ...]
    value_ticks: tuple[Tick, ...]
    category_ticks: tuple[Tick, ...]
    legend: tuple[tuple[str, str], ...]
    """(series, colour)."""
    empty: str
    horizontal: bool = False


def days_ending(today: date, days: int = DAYS) -> list[date]:
    """The ``days`` days up to and including ``today``, oldest first."""
    return [today - timedelta(days=days - 1 - i) for i in range(days)]


def daily_series(sums: Iterable[tuple[str, str, float]], days: Sequence[date]) -> dict[str, list[float]]:
    """GPU-hours per series and day from (day ``YYYY-MM-DD``, series, GPU-seconds); other days are left out."""
    index = {day.isoformat(): i for i, day in enumerate(days)}
    series: dict[str, list[float]] = {}
    for day, key, seconds in sums:
        slot = index.get(day)
        if slot is not None:
            series.setdefault(key, [0.0] * len(days))[slot] += seconds / 3600
    return series


def _top(series: Mapping[str, list[float]], top: int) -> dict[str, list[float]]:
    ranked = sorted(series, key=lambda k: (-sum(series[k]), k))
    kept = {k: list(series[k]) for k in ranked[:top]}
    rest = ranked[top:]
    if rest:
        kept[OTHER] = [sum(series[k][i] for k in rest) for i in range(len(series[rest[0]]))]
    return kept


def _nice_max(value: float) -> float:
    """A round axis maximum at or above ``value``: 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-12))


def _value_ticks(top: float, y_of: float, height: float, horizontal: bool = False) -> tuple[Tick, ...]:
    return tuple(Tick(y_of + (height * i / 4 if horizontal else height - height * i / 4), f"{top * i / 4:g}")
                 for i in range(5))


def stacked_days(title: str, days: Sequence[date], series: Mapping[str, list[float]], unit: str = "GPU-hours",
                 top: int = TOP) -> Chart:
    """Bars per day, stacked by series (the ``top`` largest named, the rest as ``other``)."""
    return stacked(title, [day.isoformat() for day in days], [day.strftime("%m-%d") for day in days],
                   _top(series, top), unit, f"No run ended in the last {len(days)} days.")


def stacked(title: str, categories: Sequence[str], labels: Sequence[str], series: Mapping[str, list[float]],
            unit: str, empty: str) -> Chart:
    """Bars per category (``labels`` along the axis), stacked by series in their order; ``empty`` is what the
    page says when every value is zero."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(categories))]
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP_MARGIN
    peak = _nice_max(max(totals, default=0.0))
    slot = plot_w / max(1, len(categories))
    colors = {key: PALETTE[i % len(PALETTE)] for i, key in enumerate(series)}
    bars: list[Bar] = []
    for i, category in enumerate(categories):
        base = 0.0
        for key, values in series.items():
            value = values[i]
            if value <= 0:
                continue
            height = plot_h * value / peak
            y = TOP_MARGIN + plot_h - plot_h * base / peak - height
            bars.append(Bar(key, category, value, LEFT + i * slot + 1, y, max(1.0, slot - 2), height,
                            colors[key], f"{key}, {category}: {value:.2f} {unit}"))
            base += value
    every = max(1, len(categories) // 6)
    ticks = tuple(Tick(LEFT + i * slot + slot / 2, label) for i, label in enumerate(labels) if i % every == 0)
    return Chart(title, WIDTH, HEIGHT, tuple(bars), _value_ticks(peak, TOP_MARGIN, plot_h), ticks,
                 tuple(colors.items()), "" if bars else empty)


def top_costs(title: str, rows: Sequence[CostRow], top: int = 10) -> Chart:
    """Horizontal bars: the ``top`` largest costs (users of a month), with their GPU-hours in the tooltip."""
    shown = [r for r in rows if r.cost > 0 or r.gpu_hours > 0][:top]
    row_h, label_w = 22, 160
    height = TOP_MARGIN + BOTTOM + row_h * max(1, len(shown))
    plot_w = WIDTH - label_w - 16
    peak = _nice_max(max((r.cost for r in shown), default=0.0))
    bars = tuple(
        Bar("cost", r.key, r.cost, label_w, TOP_MARGIN + i * row_h + 2, max(1.0, plot_w * r.cost / peak) if r.cost
            else 0.0, row_h - 4, PALETTE[0],
            f"{r.key}: cost {r.cost:.2f} for {r.gpu_hours:.2f} GPU-hours in {r.runs} run(s)"
            + (f", {r.unpriced_runs} unpriced" if r.unpriced_runs else ""))
        for i, r in enumerate(shown))
    names = tuple(Tick(TOP_MARGIN + i * row_h + row_h / 2 + 4, r.key) for i, r in enumerate(shown))
    ticks = tuple(Tick(label_w + plot_w * i / 4, f"{peak * i / 4:g}") for i in range(5))
    return Chart(title, WIDTH, height, bars, ticks, names, (), "" if bars else "No run ended this month.",
                 horizontal=True)


IN_USE, FREE = "in use", "free"
"""The series of the donors' GPU charts."""


def buckets(end: datetime, span: timedelta, count: int) -> list[datetime]:
    """The starts of ``count`` equal buckets covering ``span`` up to ``end``, oldest first; the last bucket is the
    one ``end`` falls in, aligned to the bucket size (UTC), so the bars do not shift between two views."""
    size = span / count
    epoch = datetime(2000, 1, 1, tzinfo=timezone.utc)
    last = epoch + ((end - epoch) // size) * size
    return [last - size * (count - 1 - i) for i in range(count)]


def bucket_key(start: datetime) -> str:
    """A bucket's category: its start, ``YYYY-MM-DDTHH:MMZ``."""
    return start.strftime("%Y-%m-%dT%H:%MZ")


def gpus_over_time(title: str, samples: Sequence[GpuSample], starts: Sequence[datetime], label: str) -> Chart:
    """GPUs in use and free per bucket (starts from ``buckets``): the mean of the samples taken in the bucket,
    stacked (their sum is the GPUs the donor could lend); a bucket without samples has no bar. ``label`` is
    the strftime format along the axis."""
    size = starts[1] - starts[0] if len(starts) > 1 else timedelta(hours=1)
    sums = [[0, 0, 0] for _ in starts]  # samples, in use, free
    for s in samples:
        slot = int((s.at - starts[0]) // size) if s.at >= starts[0] else -1
        if 0 <= slot < len(starts):
            sums[slot][0] += 1
            sums[slot][1] += s.gpus_in_use
            sums[slot][2] += s.gpus_free
    series = {key: [(row[k] / row[0]) if row[0] else 0.0 for row in sums] for key, k in ((IN_USE, 1), (FREE, 2))}
    empty = ("No usable GPU on this donor in this period." if any(row[0] for row in sums) else
             "No sample of this donor in this period yet: the service samples its GPUs every few minutes.")
    return stacked(title, [bucket_key(s) for s in starts], [s.strftime(label) for s in starts], series, "GPUs",
                   empty)
