"""The users page, ``api/admin/cost`` and the daily charts read running totals kept as runs are recorded: they
must say exactly what the raw run records say, through a price change mid-month, a run spanning it, runs on
both sides of a month's end, unpriced and preempted runs; and a database whose totals lag its runs (written
by an older version) gets them rebuilt when the service opens it."""

from __future__ import annotations

import dataclasses
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from gpu_offload.hub_extension.accounting.cost import priced
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.accounting.usage import MeteredRun
from gpu_offload.hub_extension.service import pages, views
from gpu_offload.hub_extension.service.charts import days_ending
from gpu_offload.hub_extension.service.state import usage_charts

H = timedelta(hours=1)
NOV = datetime(2026, 11, 1, tzinfo=timezone.utc)
TODAY = date(2026, 11, 20)
CHANGE = NOV + 14 * 24 * H  # the admin raises donor d1's price on the 15th


def _run(uid: str, user: str, cluster: str, started: datetime, hours: float, gpus: int = 1,
         preempted: bool = False) -> MeteredRun:
    return MeteredRun(uid, "jhub-" + user, "gpuo-" + uid, user, cluster, cluster + "-gpu", gpus, started,
                      started + hours * H, "Failed" if preempted else "Succeeded", preempted=preempted)


def _record(store: Store, run: MeteredRun) -> MeteredRun:
    recorded = priced(run, store.price_book(run.cluster_id, run.node))  # as the service records a run
    assert store.record_run(recorded)
    return recorded


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path}/usage.sqlite")
    store.note_prices({("d1", "d1-gpu"): 2.0, ("d2", "d2-gpu"): None, ("d3", "d3-gpu"): 1.5}, NOV - 40 * 24 * H)
    _record(store, _run("oct", "alice", "d1", datetime(2026, 10, 31, 22, tzinfo=timezone.utc), 3, gpus=2))  # ends Nov 1
    _record(store, _run("oct2", "bob", "d3", datetime(2026, 10, 25, 10, tzinfo=timezone.utc), 1))
    _record(store, _run("before", "alice", "d1", CHANGE - 30 * H, 2, gpus=2))
    _record(store, _run("unpriced", "bob", "d2", CHANGE - 10 * H, 4))
    spanning = _run("span", "carol", "d1", CHANGE - 1.5 * H, 3, gpus=4)
    store.note_prices({("d1", "d1-gpu"): 3.5}, CHANGE)
    assert _record(store, spanning).cost == pytest.approx(4 * (1.5 * 2.0 + 1.5 * 3.5))  # priced piecewise
    _record(store, _run("after", "alice", "d1", CHANGE + 48 * H, 1))
    _record(store, _run("preempted", "bob", "d3", CHANGE + 72 * H, 0.5, gpus=2, preempted=True))
    _record(store, _run("today", "dave", "d3", datetime.combine(TODAY, time(8), timezone.utc), 2))
    store.note_prices({("d1", "d1-gpu"): 9.0}, CHANGE + 100 * H)  # later changes rewrite nothing
    assert not store.record_run(spanning)  # the same pod seen again adds nothing
    return store


def _raw(store: Store, sql: str, **params: object) -> list[tuple[object, ...]]:
    """Rows of ``sql`` over the raw run records (SQL written here, not the store's)."""
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def _close(expected: dict[object, tuple[object, ...]]) -> dict[object, object]:
    """``expected`` with each row compared approximately (sums of floats in another order)."""
    return {k: pytest.approx(tuple(v)) for k, v in expected.items()}


SUMS = "count(*), sum(gpu_seconds) / 3600.0, coalesce(sum(cost), 0), sum(cost IS NULL)"


def test_totals_and_costs_are_the_sums_of_the_raw_runs(store: Store) -> None:
    truth = {(u, c): (n, h, cost, unpriced, pre) for u, c, n, h, cost, unpriced, pre in _raw(
        store, f"SELECT user, cluster_id, {SUMS}, sum(preempted) FROM gpu_offload_runs GROUP BY 1, 2")}
    totals = {(t.user, t.cluster_id): (t.runs, t.gpu_hours, t.cost, t.unpriced_runs, t.preempted)
              for t in store.totals()}
    assert totals == _close(truth)
    assert totals[("bob", "d3")][4] == 1 and totals[("bob", "d2")][3] == 1  # a preempted run, an unpriced one
    assert [(t.user, t.cluster_id) for t in store.totals("alice")] == [("alice", "d1")]
    for month in ("2026-10", "2026-11", "2026-12"):
        for by, column in (("user", "user"), ("donor", "cluster_id")):
            rows = {k: tuple(v) for k, *v in _raw(store, f"SELECT {column}, {SUMS} FROM gpu_offload_runs "
                                                  "WHERE strftime('%Y-%m', ended) = :m GROUP BY 1", m=month)}
            assert {c.key: (c.runs, c.gpu_hours, c.cost, c.unpriced_runs) for c in store.costs(by, month)} == (
                _close(rows))
        for user in ("alice", "bob", "zoe"):
            ((runs, hours, cost, _),) = _raw(store, f"SELECT {SUMS} FROM gpu_offload_runs WHERE user = :u AND "
                                                    "strftime('%Y-%m', ended) = :m", u=user, m=month)
            spent = store.spend(user, month)
            assert (spent.runs, spent.gpu_hours, spent.cost) == (runs, pytest.approx(hours or 0), pytest.approx(cost))
    months = _raw(store, f"SELECT strftime('%Y-%m', ended), {SUMS} FROM gpu_offload_runs GROUP BY 1 ORDER BY 1 DESC")
    assert [(c.key, (c.runs, c.gpu_hours, c.cost, c.unpriced_runs)) for c in store.costs("month")] == [
        (m, pytest.approx(tuple(v))) for m, *v in months]
    assert [c.key for c in store.costs("month")] == ["2026-11", "2026-10"]  # the run that ended on Nov 1 is November's


def test_the_daily_sums_are_the_raw_runs_per_day(store: Store) -> None:
    since = datetime.combine(days_ending(TODAY)[0], time(), timezone.utc)
    for by, column in (("user", "user"), ("donor", "cluster_id")):
        truth = {(d, k): s for d, k, s in _raw(store, f"SELECT date(ended), {column}, sum(gpu_seconds) FROM "
                                                      "gpu_offload_runs WHERE date(ended) >= :since GROUP BY 1, 2",
                                               since=since.date().isoformat())}
        assert {(d, k): s for d, k, s in store.daily(by, since)} == pytest.approx(truth)
        assert ("2026-11-20", "dave" if by == "user" else "d3") in truth  # today's run is in
        assert not [d for d, _ in truth if d < since.date().isoformat()]


def test_the_users_page_shows_the_raw_runs_cost(store: Store) -> None:
    """The page as ``HubState.usage_page`` builds it: each user's cost of the month is the raw runs' sum."""
    report = views.CostReport("2026-11", tuple(store.costs("user", "2026-11")), tuple(store.costs("donor", "2026-11")),
                              tuple(store.costs("month")))
    html = pages.users_page(pages.HubContext("/services/gpu-offload/", "admin", True, "x"), store.totals(), report,
                            usage_charts(store, "2026-11", TODAY))
    for user, cost in _raw(store, "SELECT user, coalesce(sum(cost), 0) FROM gpu_offload_runs "
                                  "WHERE strftime('%Y-%m', ended) = '2026-11' GROUP BY 1"):
        assert f"<td>{user}</td><td>" in html and f"<td>{pages.money(float(cost))}</td>" in html  # type: ignore[arg-type]


def test_totals_that_lag_the_runs_are_rebuilt_when_the_database_is_opened(store: Store, tmp_path: Path) -> None:
    before = (store.totals(), store.costs("month"), store.daily("donor", NOV))
    late = dataclasses.replace(_run("late", "erin", "d3", NOV + 5 * H, 2), cost=3.0, price_per_gpu_hour=1.5)
    with store.engine.begin() as conn:  # an older version recorded a run without the totals
        conn.execute(sa.text("INSERT INTO gpu_offload_runs (pod_uid, namespace, pod, user, cluster_id, node, gpus, "
                             "started, ended, phase, gpu_seconds, month, price_per_gpu_hour, cost, preempted) VALUES "
                             "('late', 'jhub-erin', 'gpuo-late', 'erin', 'd3', 'd3-gpu', 1, :s, :e, 'Succeeded', "
                             "7200, '2026-11', 1.5, 3.0, 0)"), {"s": late.started.replace(tzinfo=None),
                                                                 "e": late.ended.replace(tzinfo=None)})
    assert store.totals() == before[0]  # not counted yet
    store.close()
    reopened = Store(f"sqlite:///{tmp_path}/usage.sqlite")
    erin = [t for t in reopened.totals() if t.user == "erin"]
    assert [(t.runs, t.gpu_hours, t.cost) for t in erin] == [(1, pytest.approx(2.0), pytest.approx(3.0))]
    assert {(t.user, t.cluster_id): t.runs for t in reopened.totals() if t.user != "erin"} == {
        (t.user, t.cluster_id): t.runs for t in before[0]}
    november = next(c for c in reopened.costs("month") if c.key == "2026-11")
    assert november.runs == next(c for c in before[1] if c.key == "2026-11").runs + 1
    assert ("2026-11-01", "d3", 7200.0) in [(d, k, pytest.approx(s)) for d, k, s in reopened.daily("donor", NOV)]
    reopened.close()
