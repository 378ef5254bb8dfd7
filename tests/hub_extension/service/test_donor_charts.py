"""A donor's GPUs over time: the service samples the inventory into its database (on each change and every
period, kept for a bounded time), and the cluster page charts exactly those samples per hour and per six
hours, in use and free."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from gpu_offload.hub_extension.accounting.store import GpuSample, Store
from gpu_offload.hub_extension.service import charts, pages, views
from gpu_offload.hub_extension.service.sampling import PERIOD, RETENTION, Sampler
from gpu_offload.hub_extension.service.state import donor_charts
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord

NOW = datetime(2026, 11, 20, 12, 40, tzinfo=timezone.utc)


def inventory(**donors: tuple[int, int]) -> Inventory:
    """One virtual node per donor with (capacity, in use) GPUs."""
    return Inventory(tuple(
        ClusterRecord(cid, cid, "provider", "healthy",
                      virtual_nodes=(VirtualNodeRecord(f"{cid}-gpu", cid, cap, cap, used),))
        for cid, (cap, used) in donors.items()))


def stored(engine: sa.Engine) -> list[tuple[str, int, int, int]]:
    query = sa.text("SELECT cluster_id, gpus_total, gpus_free, gpus_in_use FROM gpu_offload_inventory_samples "
                    "ORDER BY id")
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(query)]  # type: ignore[misc]


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path}/usage.sqlite")


def test_samples_are_written_on_change_and_every_period_and_old_ones_dropped(store: Store) -> None:
    sampler = Sampler(store)
    sampler.sample(inventory(a=(4, 1), b=(2, 0)), NOW)
    assert stored(store.engine) == [("a", 4, 3, 1), ("b", 2, 2, 0)]  # the first look records every donor
    assert sampler.sample(inventory(a=(4, 1), b=(2, 0)), NOW + timedelta(minutes=1)) == []  # nothing changed
    sampler.sample(inventory(a=(4, 3), b=(2, 0)), NOW + timedelta(minutes=2))
    assert stored(store.engine)[2:] == [("a", 4, 1, 3)]  # only the donor that changed
    sampler.sample(inventory(a=(4, 3), b=(2, 0)), NOW + PERIOD)
    assert stored(store.engine)[3:] == [("a", 4, 1, 3), ("b", 2, 2, 0)]  # a quiet inventory still gets points
    # a restarted service keeps what the database holds, and drops what is older than the retention
    later = Sampler(store)
    later.sample(inventory(a=(4, 0)), NOW + RETENTION + timedelta(minutes=3))
    assert stored(store.engine) == [("a", 4, 1, 3), ("b", 2, 2, 0), ("a", 4, 4, 0)]


def sql_means(engine: sa.Engine, cluster_id: str, bucket_sql: str, since: datetime) -> dict[tuple[str, str], float]:
    """Mean GPUs in use and free per bucket, in SQL written here (not the chart's arithmetic)."""
    query = sa.text(f"SELECT {bucket_sql} AS b, avg(gpus_in_use), avg(gpus_free) FROM gpu_offload_inventory_samples "
                    "WHERE cluster_id = :c AND at >= :since GROUP BY b")
    out: dict[tuple[str, str], float] = {}
    with engine.connect() as conn:
        for bucket, in_use, free in conn.execute(query, {"c": cluster_id, "since": since.strftime("%Y-%m-%d %H:%M:%S")}):
            for series, value in ((charts.IN_USE, in_use), (charts.FREE, free)):
                if value:
                    out[(series, bucket)] = float(value)
    return out


HOUR = "strftime('%Y-%m-%dT%H:00Z', at)"
SIX_HOURS = "strftime('%Y-%m-%dT', at) || printf('%02d:00Z', (CAST(strftime('%H', at) AS INTEGER) / 6) * 6)"


def bars(chart: charts.Chart) -> dict[tuple[str, str], float]:
    return {(b.series, b.category): b.value for b in chart.bars}


def week_of_samples(store: Store) -> None:
    """Samples of donor a every 20 minutes for 9 days (in use cycling 0..4 of 4), and one of donor b."""
    samples = [GpuSample(NOW - timedelta(minutes=20 * i), "a", 4, 4 - i % 5, i % 5) for i in range(9 * 72)]
    samples.append(GpuSample(NOW - timedelta(hours=2), "b", 8, 8, 0))
    store.add_samples(samples, NOW - timedelta(days=30))


def test_the_cluster_charts_show_the_samples_in_the_database(store: Store) -> None:
    week_of_samples(store)
    drawn = donor_charts(store, "a", NOW)
    day_start = datetime(2026, 11, 19, 13, tzinfo=timezone.utc)  # 24 hourly buckets ending with 12:00-13:00
    assert bars(drawn.last_day) == pytest.approx(sql_means(store.engine, "a", HOUR, day_start))
    assert {b.category for b in drawn.last_day.bars} == {charts.bucket_key(day_start + timedelta(hours=h))
                                                         for h in range(24)}
    week_start = datetime(2026, 11, 13, 18, tzinfo=timezone.utc)  # 28 buckets ending with 12:00-18:00
    assert bars(drawn.last_week) == pytest.approx(sql_means(store.engine, "a", SIX_HOURS, week_start))
    assert len({b.category for b in drawn.last_week.bars}) == 28
    # stacked: in use plus free is what the donor could lend, 4 GPUs in every bucket
    per_bucket: dict[str, float] = {}
    for (_, bucket), value in bars(drawn.last_week).items():
        per_bucket[bucket] = per_bucket.get(bucket, 0.0) + value
    assert len(per_bucket) == 28 and all(v == pytest.approx(4.0) for v in per_bucket.values())
    # another donor's samples are not in this donor's chart
    assert bars(donor_charts(store, "b", NOW).last_day) == {(charts.FREE, "2026-11-20T10:00Z"): 8.0}


def test_a_donor_without_samples_says_why(store: Store) -> None:
    drawn = donor_charts(store, "a", NOW)
    assert not drawn.last_day.bars and "No sample of this donor" in drawn.last_day.empty


def svg_bars(html: str) -> dict[tuple[str, str], float]:
    found = re.findall(r'data-series="([^"]*)"\s+data-category="([^"]*)" data-value="([^"]*)"', html)
    return {(s, c): float(v) for s, c, v in found}


def test_the_cluster_page_draws_its_charts(store: Store) -> None:
    week_of_samples(store)
    inv = inventory(a=(4, 1))
    detail = views.cluster_detail(inv, "a", [], [], [], NOW)
    assert detail is not None
    drawn = donor_charts(store, "a", NOW)
    html = pages.cluster_page(pages.HubContext("/services/gpu-offload/", "admin", True, "x"), detail, drawn)
    assert "GPUs in use and free, last day" in html and "last week" in html
    _, day_html, week_html = html.split("<figure class=\"gpu-offload-chart\">")
    assert svg_bars(day_html) == pytest.approx(bars(drawn.last_day))
    assert svg_bars(week_html) == pytest.approx(bars(drawn.last_week))
    assert "<script" not in html.split("GPUs over time")[1].split("Virtual nodes")[0]

