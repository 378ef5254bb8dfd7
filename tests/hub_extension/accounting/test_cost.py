"""Cost: runs priced at the donor's price while they ran (piecewise across a change), kept when prices
change later, summed per user, donor and month; an older database is migrated; the billing CSV; and the
service (in process, on the sandbox, no hub here to meter in its place) prices a run deleted while it was
down at the price of its time, not at the price it finds on its return."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone
from pathlib import Path

import kubernetes
import pytest
import sqlalchemy as sa
from gpu_offload.hub_extension.accounting.billing import COLUMNS, csv_chunks
from gpu_offload.hub_extension.accounting.cost import PricePoint, price_run, priced, stretches
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.accounting.usage import MeteredRun
from gpu_offload.hub_extension.config import HubConfig
from gpu_offload.hub_extension.service.state import HubState
from gpu_offload.liqo_peering.trust import policy_from_config
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..conftest import held_pod, offloaded_namespace

NOV = datetime(2026, 11, 1, tzinfo=timezone.utc)
H = timedelta(hours=1)


def _run(uid: str, user: str, cluster: str, start: datetime, hours: float, gpus: int = 1, node: str = "",
         price: float | None = None, cost: float | None = None) -> MeteredRun:
    return MeteredRun(uid, "jhub-" + user, "gpuo-" + uid, user, cluster, node or f"{cluster}-gpu", gpus, start,
                      start + hours * H, "Succeeded", price, cost)


def _priced(store: Store, run: MeteredRun) -> MeteredRun:
    """The run as the service records it: priced against the store's book."""
    return priced(run, store.price_book(run.cluster_id, run.node))


def test_a_price_change_mid_month_prices_each_run_at_the_price_of_its_time(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/usage.sqlite")
    store.note_prices({("d1", "d1-gpu"): 2.0}, NOV)
    before = _priced(store, _run("a", "alice", "d1", NOV + 9 * 24 * H, 1.5, gpus=2))
    assert store.record_run(before)
    store.note_prices({("d1", "d1-gpu"): 3.0}, NOV + 14 * 24 * H)  # the admin raised the price on the 15th
    after = _priced(store, _run("b", "alice", "d1", NOV + 19 * 24 * H, 1.0, gpus=2))
    assert store.record_run(after)
    assert (before.price_per_gpu_hour, before.cost) == (2.0, pytest.approx(6.0))
    assert (after.price_per_gpu_hour, after.cost) == (3.0, pytest.approx(6.0))
    store.note_prices({("d1", "d1-gpu"): 10.0}, NOV + 25 * 24 * H)  # later changes never rewrite history
    (month,) = store.costs("month")
    assert (month.key, month.runs, month.gpu_hours, month.cost) == ("2026-11", 2, pytest.approx(5.0), pytest.approx(12.0))
    assert {r.pod_uid: r.cost for r in store.runs("alice")} == {"a": pytest.approx(6.0), "b": pytest.approx(6.0)}
    store.close()


def test_a_run_spanning_a_price_change_is_priced_piecewise() -> None:
    book = [PricePoint(NOV, 2.0), PricePoint(NOV + 12 * H, 3.0)]
    # one GPU from 11:00 to 13:30: an hour at 2.0, then 1.5 hours at 3.0
    run = price_run(book, 1, NOV + 11 * H, NOV + 13.5 * H)
    assert run.cost == pytest.approx(2.0 + 4.5)
    assert run.price_per_gpu_hour == pytest.approx(6.5 / 2.5)  # what the run works out at per GPU-hour
    assert [s.price for s in stretches(book, NOV + 11 * H, NOV + 13.5 * H)] == [2.0, 3.0]
    assert price_run(book, 4, NOV + 11 * H, NOV + 13.5 * H).cost == pytest.approx(4 * 6.5)


def test_before_the_first_note_the_first_price_applies_and_unpriced_time_costs_nothing() -> None:
    book = [PricePoint(NOV + 5 * H, 2.0)]  # the service first saw the node at 05:00
    assert price_run(book, 1, NOV + 1 * H, NOV + 2 * H).cost == pytest.approx(2.0)
    assert price_run([], 1, NOV, NOV + H).cost is None
    unpriced_then_priced = [PricePoint(NOV, None), PricePoint(NOV + H, 4.0)]
    run = price_run(unpriced_then_priced, 1, NOV, NOV + 2 * H)
    assert run.cost == pytest.approx(4.0)
    assert price_run([PricePoint(NOV, None)], 1, NOV, NOV + H).price_per_gpu_hour is None


def test_cost_per_user_donor_and_month(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/usage.sqlite")
    for run in (_run("1", "alice", "d1", NOV + 24 * H, 2, price=2.0, cost=4.0),
                _run("2", "bob", "d1", NOV + 48 * H, 1, gpus=4, price=2.0, cost=8.0),
                _run("3", "alice", "d2", NOV + 72 * H, 1, price=None, cost=None),
                _run("4", "alice", "d2", NOV - 24 * H, 1, price=3.0, cost=3.0)):  # ended in October
        assert store.record_run(run)
    users = {c.key: (c.runs, c.cost, c.unpriced_runs) for c in store.costs("user", month="2026-11")}
    assert users == {"alice": (2, 4.0, 1), "bob": (1, 8.0, 0)}
    donors = {c.key: (c.gpu_hours, c.cost) for c in store.costs("donor", month="2026-11")}
    assert donors == {"d1": (pytest.approx(6.0), 8.0 + 4.0), "d2": (pytest.approx(1.0), 0.0)}
    assert [(c.key, c.cost) for c in store.costs("month")] == [("2026-11", 12.0), ("2026-10", 3.0)]
    assert store.spend("alice", "2026-11").cost == 4.0 and store.spend("carol", "2026-11").runs == 0
    store.close()


OLD_SCHEMA = """
CREATE TABLE gpu_offload_runs (
    pod_uid VARCHAR(64) NOT NULL PRIMARY KEY, namespace VARCHAR(253) NOT NULL, pod VARCHAR(253) NOT NULL,
    user VARCHAR(255) NOT NULL, cluster_id VARCHAR(253) NOT NULL, node VARCHAR(253) NOT NULL,
    gpus INTEGER NOT NULL, started DATETIME NOT NULL, ended DATETIME NOT NULL, phase VARCHAR(16) NOT NULL,
    gpu_seconds FLOAT NOT NULL)
"""


def test_a_database_of_the_previous_version_is_migrated_and_its_runs_read_as_unpriced(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.sqlite"
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the table as the service before cost (issue 17) created it
        conn.execute(sa.text(OLD_SCHEMA))
        conn.execute(sa.text("INSERT INTO gpu_offload_runs VALUES ('old-1', 'jhub-alice', 'gpuo-old', 'alice', "
                             "'d1', 'd1-gpu', 2, '2026-10-31 23:00:00', '2026-11-01 00:30:00', 'Succeeded', 10800)"))
    engine.dispose()
    store = Store(url)
    (old,) = store.runs("alice")
    assert (old.gpu_seconds, old.price_per_gpu_hour, old.cost) == (10800, None, None)
    assert store.record_run(_run("new-1", "alice", "d1", NOV + 24 * H, 1, price=2.0, cost=2.0))
    (month,) = store.costs("month")  # the old run's month was filled in from its end
    assert (month.key, month.runs, month.cost, month.unpriced_runs) == ("2026-11", 2, 2.0, 1)
    store.close()
    again = Store(url)  # opening a migrated database changes nothing
    assert [c.runs for c in again.costs("user")] == [2]
    again.close()


def test_the_csv_has_one_line_per_run_with_price_and_cost_and_no_formula(tmp_path: Path) -> None:
    runs = [_run("1", "=HYPERLINK(\"http://x\")", "d1", NOV, 1.5, gpus=2, price=2.0, cost=6.0),
            _run("2", "bob", "d2", NOV + H, 1, price=None, cost=None)]
    text = "".join(csv_chunks(runs, lines_per_chunk=1))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(COLUMNS)
    assert rows[0]["user"] == "'=HYPERLINK(\"http://x\")"  # shown as text by a spreadsheet, never evaluated
    assert (rows[0]["gpu_hours"], rows[0]["price_per_gpu_hour"], rows[0]["cost"], rows[0]["month"]) == (
        "3", "2", "6", "2026-11")
    assert (rows[1]["price_per_gpu_hour"], rows[1]["cost"]) == ("", "")


def _config(price: float) -> HubConfig:
    return HubConfig(clusters=policy_from_config({"donor-1": {"pricePerGpuHour": price}}))


def test_a_run_deleted_while_the_service_was_down_is_priced_at_the_price_of_its_time(
        origin: RunningOrigin, tmp_path: Path) -> None:
    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    url = f"sqlite:///{tmp_path}/usage.sqlite"
    try:
        state = HubState(_config(2.0), client, Store(url)).start()
        try:
            assert state.wait_synced(60)
            done = tmp_path / "done"
            done.touch()  # this one ends at once: recorded at 2.0, and seen again after the restart
            core.create_namespaced_pod(ns, held_pod("gpuo-early", "carol", "donor-1", done))
            wait_until(lambda: state.store.runs("carol"), "the first run to be recorded")
        finally:
            state.close()
        # the service is down: a held run starts and is deleted, and the admin raises the chart's price
        held = held_pod("gpuo-held", "carol", "donor-1", tmp_path / "never")
        held["metadata"]["finalizers"] = ["gpu-offload.io/metered"]
        core.create_namespaced_pod(ns, held)
        wait_until(lambda: core.read_namespaced_pod("gpuo-held", ns).status.phase == "Running", "the run to start")
        core.delete_namespaced_pod("gpuo-held", ns, grace_period_seconds=0)
        held_meta = core.read_namespaced_pod("gpuo-held", ns).metadata  # kept by the meter's finalizer
        restarted = HubState(_config(9.0), client, Store(url)).start()
        try:
            assert restarted.wait_synced(60)
            wait_until(lambda: len(restarted.store.runs("carol")) == 2, "the held run to be recorded")
            runs = {r.pod: r for r in restarted.store.runs("carol")}
            # never seen running by the meter: from its creation to its deletion, not from the restart
            assert (runs["gpuo-held"].started, runs["gpuo-held"].ended) == (
                held_meta.creation_timestamp, held_meta.deletion_timestamp)
            for run in runs.values():
                assert run.price_per_gpu_hour == 2.0
                assert run.cost == pytest.approx(2.0 * run.gpu_seconds / 3600)
            wait_until(lambda: restarted.store.price_book("donor-1", "donor-1-gpu")[-1].price == 9.0,
                       "the new price to be noted")
            assert {r.pod: r.cost for r in restarted.store.runs("carol")} == {k: r.cost for k, r in runs.items()}
        finally:
            restarted.close()
    finally:
        core.delete_namespace(ns)
        client.close()


@pytest.mark.parametrize("value", ["lots", -1, True])
def test_a_bad_budget_is_refused_naming_the_value_and_the_fix(value: object) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.liqo_peering import environment as E
    from gpu_offload.liqo_peering.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="offload.monthlyBudgetPerUser=.*must be a number of 0 or more"):
        parse_config({"offload": {"monthlyBudgetPerUser": value}})
    with pytest.raises(E.InvalidSetting, match="GPU_OFFLOAD_MONTHLY_BUDGET="):
        E.MONTHLY_BUDGET.read({"GPU_OFFLOAD_MONTHLY_BUDGET": str(value) if value is not True else "yes"})
