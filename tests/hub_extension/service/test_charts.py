"""The users page's charts: what each bar says is what the database holds (GPU-hours per day by user and by
donor, top users of the month by cost), drawn to scale; many users fold into "other"."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.accounting.usage import MeteredRun
from gpu_offload.hub_extension.service import charts, views
from gpu_offload.hub_extension.service.state import my_usage_chart, usage_charts

TODAY = date(2026, 11, 20)
NOON = datetime(2026, 11, 20, 12, tzinfo=timezone.utc)


def _run(uid: str, user: str, cluster: str, ended: datetime, hours: float, gpus: int, price: float) -> MeteredRun:
    started = ended - timedelta(hours=hours)
    return MeteredRun(uid, "ns", "gpuo-" + uid, user, cluster, cluster + "-gpu", gpus, started, ended, "Succeeded",
                      price, gpus * hours * price)


def sql_daily(engine: sa.Engine, column: str, since: date) -> dict[tuple[str, str], float]:
    """GPU-hours per (series, day) straight from the database, in SQL written here (not the store's query)."""
    query = sa.text(f"SELECT {column}, date(ended), sum(gpu_seconds) / 3600.0 FROM gpu_offload_runs "
                    "WHERE date(ended) >= :since GROUP BY 1, 2")
    with engine.connect() as conn:
        return {(str(k), str(d)): float(v) for k, d, v in conn.execute(query, {"since": since.isoformat()})}


def sql_month_costs(engine: sa.Engine, month: str) -> list[tuple[str, float]]:
    query = sa.text("SELECT user, sum(cost) FROM gpu_offload_runs WHERE strftime('%Y-%m', ended) = :m "
                    "GROUP BY user ORDER BY 2 DESC, 1")
    with engine.connect() as conn:
        return [(str(u), float(c or 0)) for u, c in conn.execute(query, {"m": month})]


def bar_values(chart: charts.Chart) -> dict[tuple[str, str], float]:
    return {(b.series, b.category): b.value for b in chart.bars}


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path}/usage.sqlite")
    runs = [_run("a1", "alice", "donor-1", NOON - timedelta(days=1), 1.0, 2, 2.0),
            _run("b1", "bob", "donor-2", NOON - timedelta(days=1), 3.0, 1, 2.25),
            _run("a2", "alice", "donor-2", NOON, 0.5, 4, 2.25),
            _run("old", "carol", "donor-1", NOON - timedelta(days=40), 5.0, 1, 2.0),  # before the 30 days
            _run("oct", "dave", "donor-1", datetime(2026, 10, 1, 23, tzinfo=timezone.utc), 1.0, 1, 2.0)]
    runs += [_run(f"m{i}", f"user{i:02d}", "donor-1", NOON - timedelta(days=2), 0.1 * (i + 1), 1, 2.0)
             for i in range(10)]
    for run in runs:
        assert store.record_run(run)
    return store


def test_the_daily_charts_show_what_the_database_holds(store: Store) -> None:
    drawn = usage_charts(store, "2026-11", TODAY)
    since = charts.days_ending(TODAY)[0]
    for chart, column in ((drawn.per_day_by_user, "user"), (drawn.per_day_by_donor, "cluster_id")):
        truth = sql_daily(store.engine, column, since)
        per_day: dict[str, float] = defaultdict(float)
        for (_, day), hours in truth.items():
            per_day[day] += hours
        bars = bar_values(chart)
        drawn_per_day: dict[str, float] = defaultdict(float)
        for (series, day), hours in bars.items():
            drawn_per_day[day] += hours
            if series != charts.OTHER:  # a named series is exactly its row in the database
                assert hours == pytest.approx(truth[(series, day)])
        assert drawn_per_day == pytest.approx(dict(per_day))
        assert "carol" not in {s for s, _ in bars} and "2026-10-11" not in {d for _, d in bars}
    by_donor = bar_values(drawn.per_day_by_donor)
    assert by_donor[("donor-2", "2026-11-20")] == pytest.approx(2.0)  # 4 GPUs for half an hour


def test_many_users_fold_into_other_and_the_largest_are_named(store: Store) -> None:
    chart = usage_charts(store, "2026-11", TODAY).per_day_by_user
    named = [key for key, _ in chart.legend]
    assert len(named) == charts.TOP + 1 and named[-1] == charts.OTHER
    assert named[:2] == ["alice", "bob"]  # 4 GPU-hours (over two days), then 3, lead
    other = sum(b.value for b in chart.bars if b.series == charts.OTHER)
    assert other == pytest.approx(0.1 + 0.2 + 0.3 + 0.4)  # the four smallest of the ten


def test_bars_are_drawn_to_scale(store: Store) -> None:
    chart = usage_charts(store, "2026-11", TODAY).per_day_by_user
    plot_h = charts.HEIGHT - charts.BOTTOM - charts.TOP_MARGIN
    peak = float(chart.value_ticks[-1].text)
    heights: dict[str, float] = defaultdict(float)
    values: dict[str, float] = defaultdict(float)
    for bar in chart.bars:
        heights[bar.category] += bar.height
        values[bar.category] += bar.value
    for day, height in heights.items():
        assert height == pytest.approx(plot_h * values[day] / peak)
    assert max(values.values()) <= peak


def test_the_top_users_chart_is_the_months_cost_per_user(store: Store) -> None:
    chart = usage_charts(store, "2026-11", TODAY).top_users
    truth = sql_month_costs(store.engine, "2026-11")
    assert [(b.category, pytest.approx(b.value)) for b in chart.bars] == truth[:10]
    assert "dave" not in [b.category for b in chart.bars]  # his run ended in October
    assert "cost 8.50 for 4.00 GPU-hours in 2 run(s)" in next(b.text for b in chart.bars if b.category == "alice")


def test_an_empty_month_says_so(tmp_path: Path) -> None:
    drawn = usage_charts(Store(f"sqlite:///{tmp_path}/empty.sqlite"), "2026-11", TODAY)
    assert not drawn.per_day_by_user.bars and "No run ended" in drawn.per_day_by_user.empty
    assert not drawn.top_users.bars and "No run ended this month" in drawn.top_users.empty


def test_a_users_own_chart_is_their_runs_per_day_and_donor(store: Store) -> None:
    """What ``api/me`` answers as ``gpu_hours_per_day``: only the caller's runs, per day and donor."""
    query = sa.text("SELECT cluster_id, date(ended), sum(gpu_seconds) / 3600.0 FROM gpu_offload_runs "
                    "WHERE user = :u AND date(ended) >= :since GROUP BY 1, 2")
    with store.engine.connect() as conn:
        truth = {(str(k), str(d)): float(v) for k, d, v in
                 conn.execute(query, {"u": "alice", "since": charts.days_ending(TODAY)[0].isoformat()})}
    answer = views.chart_data(my_usage_chart(store, "alice", TODAY))
    assert {(b["series"], b["category"]): b["value"] for b in answer["bars"]} == pytest.approx(truth)
    assert truth == pytest.approx({("donor-1", "2026-11-19"): 2.0, ("donor-2", "2026-11-20"): 2.0})
    json.dumps(answer)  # it is sent as JSON
    nobody = views.chart_data(my_usage_chart(store, "carol", TODAY))  # her only run is 40 days old
    assert nobody["bars"] == [] and "No run ended" in nobody["empty"]
