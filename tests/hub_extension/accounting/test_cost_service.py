"""Cost end to end against the sandbox: the real hub's service prices a run that spans a price change,
keeps its cost when the price changes again, and shows it in its JSON API, CSV and ``api/me``; a kernel
with a monthly budget is refused before launch."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import sqlalchemy as sa
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.service.pages import money
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.hub_api import HubSpend
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.budget import check_budget
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.errors import OffloadUsageError

from ..conftest import free_port, held_pod, offloaded_namespace

NODE = "donor-2-gpu"


def _set_price(hub: Any, price: str) -> None:
    answer = hub.api("POST", "api/admin/actions/label", "admin",
                     {"cluster_id": "donor-2", "node": NODE, "model": "A100", "price": price, "confirm": True})
    assert answer.status == 200, answer.text


def _book(hub: Any) -> list[Any]:
    store = Store(f"sqlite:///{hub.workdir}/usage.sqlite")  # the service's own database, read beside it
    try:
        return store.price_book("donor-2", NODE)
    finally:
        store.close()


def _finished(hub: Any, pod: str) -> dict[str, Any] | None:
    mine = hub.api("GET", "api/me", "alice").json()
    return next((r for r in mine["finished"] if r["pod"] == pod), None)


def test_a_run_spanning_a_price_change_is_priced_piecewise_and_shown_everywhere(
        hub: Any, origin: RunningOrigin, tmp_path: Path) -> None:
    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    trigger = tmp_path / "stop"
    try:
        wait_until(lambda: [p for p in _book(hub) if p.price == 2.25], "the service to note donor-2's price")
        core.create_namespaced_pod(ns, held_pod("gpuo-span", "alice", "donor-2", trigger, gpus=2))
        wait_until(lambda: core.read_namespaced_pod("gpuo-span", ns).status.phase == "Running", "the run to start")
        _set_price(hub, "3.5")  # the price goes up while the run holds its GPUs
        change = wait_until(lambda: next((p.since for p in _book(hub) if p.price == 3.5), None),
                            "the service to note the new price")
        # pod times have one-second precision: let the clock pass the change's second before the run ends
        wait_until(lambda: datetime.now(timezone.utc) >= change.replace(microsecond=0) + timedelta(seconds=2),
                   "the clock to pass the price change")
        trigger.touch()
        run = wait_until(lambda: _finished(hub, "gpuo-span"), "the run to be recorded")
        started, ended = datetime.fromisoformat(run["started"]), datetime.fromisoformat(run["ended"])
        assert started < change < ended
        before, after = (change - started).total_seconds() / 3600, (ended - change).total_seconds() / 3600
        assert run["cost"] == pytest.approx(2 * (2.25 * before + 3.5 * after))
        assert 2.25 < run["price_per_gpu_hour"] < 3.5

        _set_price(hub, "2.25")  # back down: what the run cost does not change
        wait_until(lambda: _book(hub)[-1].price == 2.25, "the service to note the price back at 2.25")
        assert _finished(hub, "gpuo-span") == run

        month = started.strftime("%Y-%m") if ended.month == started.month else ended.strftime("%Y-%m")
        report = hub.api("GET", f"api/admin/cost?month={month}", "vera").json()
        assert {c["key"]: c["cost"] for c in report["by_user"]}["alice"] == pytest.approx(run["cost"])
        assert {c["key"]: c["cost"] for c in report["by_donor"]}["donor-2"] == pytest.approx(run["cost"])
        assert report["by_month"][0]["key"] == month

        mine = hub.api("GET", "api/me", "alice").json()
        me = mine["this_month"]
        assert (me["cost"], me["budget"], me["runs"]) == (pytest.approx(run["cost"]), None, 1)
        # her own chart: GPU-hours per day and donor of her runs, the run's day among them
        day = ended.astimezone(timezone.utc).date().isoformat()
        bars = {(b["series"], b["category"]): b["value"] for b in mine["gpu_hours_per_day"]["bars"]}
        assert bars[("donor-2", day)] == pytest.approx(sum(
            r["gpu_seconds"] for r in mine["finished"]
            if r["cluster_id"] == "donor-2" and r["ended"][:10] == day) / 3600)

        # the donor's page charts its GPUs from the samples the service took since it started
        donor_page = hub.api("GET", "clusters/donor-2", "vera")
        assert donor_page.status == 200 and "GPUs in use and free, last day" in donor_page.text
        assert 'data-series="free"' in donor_page.text or 'data-series="in use"' in donor_page.text

        exported = hub.api("GET", f"api/admin/usage.csv?month={month}", "vera")
        assert exported.status == 200 and exported.headers.get("content-type", "").startswith("text/csv")
        (line,) = [r for r in csv.DictReader(io.StringIO(exported.text)) if r["pod"] == "gpuo-span"]
        assert (line["user"], line["cluster_id"], line["gpus"]) == ("alice", "donor-2", "2")
        assert float(line["cost"]) == pytest.approx(run["cost"], abs=1e-5)

        page = hub.api("GET", f"users?month={month}", "vera")
        assert page.status == 200 and f"<td>{money(run['cost'])}</td>" in page.text
        for path in ("api/admin/cost", "api/admin/usage.csv"):  # billing data is for viewers, not users
            assert hub.api("GET", path, "alice").status == 403
        bad = hub.api("GET", "api/admin/cost?month=November", "vera")
        assert bad.status == 400 and "like 2026-11" in bad.json()["error"]
    finally:
        trigger.touch()
        core.delete_namespace(ns)
        client.close()


def test_a_cell_past_the_budget_is_refused_before_launch_saying_spend_and_limit(
        hub: Any, origin: RunningOrigin) -> None:
    spent = wait_until(lambda: HubSpend(hub.service_url, hub.token("alice")).read().cost or None,
                       "alice to have spent something (the test above)")
    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    settings = KubeSettings(namespace=ns, user="alice", kernel=f"k-{uuid.uuid4().hex[:8]}", watch_seconds=5,
                            service_url=hub.service_url, hub_token=hub.token("alice"), budget=spent / 2)
    backend = KubernetesBackend(settings, client)
    try:
        cell = "x = 1"
        analysis = analyse_cell(cell, {})
        job, _ = build_job(cell, analysis, {}, backend.transfer, request=RunRequest(gpus=1))
        with pytest.raises(OffloadUsageError) as refused:
            backend.submit(job)
        text = str(refused.value)
        assert f"cost {spent:.2f}" in text and f"the limit is {spent / 2:g}" in text
        assert "Nothing was launched" in text and "already running go on" in text
        assert not core.list_namespaced_pod(ns).items and not core.list_namespaced_secret(ns).items
        assert "of a monthly budget of" in backend.describe()  # %gpu_offload status says it too
        check_budget(spent * 2, HubSpend(hub.service_url, hub.token("alice")))  # under the budget: no refusal
        unreachable = HubSpend(f"http://127.0.0.1:{free_port()}/services/gpu-offload/", hub.token("alice"))
        with pytest.raises(OffloadUsageError) as unknown:
            check_budget(spent * 2, unreachable)
        assert "could not be checked" in str(unknown.value) and "Nothing was launched" in str(unknown.value)
    finally:
        backend.close()
        core.delete_namespace(ns)
        client.close()


def test_the_panel_shows_the_users_own_spend_and_budget(hub: Any, tmp_path: Path) -> None:
    from gpu_offload.magics.dashboard.sources import KernelFeeds

    from gpu_offload.engine.runs.records import RunBook
    from gpu_offload.engine.runs.tracking import Tracker

    class Magic:  # a kernel configured for the hub alone: the panel asks it for no cluster backend
        backend, default_cluster = "auto", "auto"

        def cluster_backend(self) -> None:
            raise AssertionError("no namespace is configured: the panel must not start a cluster backend")

    spent = HubSpend(hub.service_url, hub.token("alice")).read()
    env = {"GPU_OFFLOAD_SERVICE_URL": hub.service_url, "JUPYTERHUB_API_TOKEN": hub.token("alice"),
           "GPU_OFFLOAD_MONTHLY_BUDGET": "500"}
    feeds = KernelFeeds(Magic(), env, Tracker(RunBook(tmp_path / "runs"), kernel="k"))
    rows, notes = feeds.clusters()
    assert {r.key for r in rows} >= {"local", "donor-1", "donor-2"}
    (line,) = [n for n in notes if n.startswith("GPU usage in")]
    assert f"{spent.gpu_hours:.2f} GPU-hours, cost {spent.cost:.2f} of a monthly budget of 500" in line


class _Svg(HTMLParser):
    """The users page's charts as served: each figure's title and its bars' data attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[tuple[str, list[dict[str, str]]]] = []
        self.urls: list[str] = []
        self._caption = self._figure = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        self._figure = self._figure or tag == "figure"
        if tag == "figcaption":
            self._caption = True
            self.figures.append(("", []))
        elif tag == "rect" and "data-series" in found:
            self.figures[-1][1].append(found)
        if self._figure:  # anything inside a chart the browser would fetch
            self.urls += [v for k, v in found.items() if k in ("href", "src", "xlink:href") or "url(" in v]

    def handle_data(self, data: str) -> None:
        if self._caption:
            self.figures[-1] = (self.figures[-1][0] + data.strip(), self.figures[-1][1])

    def handle_endtag(self, tag: str) -> None:
        self._caption = self._caption and tag != "figcaption"
        self._figure = self._figure and tag != "figure"


def test_the_users_page_charts_show_what_the_services_database_holds(hub: Any) -> None:
    from ..service.test_charts import sql_daily, sql_month_costs

    wait_until(lambda: hub.api("GET", "api/admin/usage", "vera").json()["usage"], "a run recorded (the tests above)")
    page = hub.api("GET", "users", "vera")
    assert page.status == 200
    parsed = _Svg()
    parsed.feed(page.text)
    figures = dict(parsed.figures)
    assert not parsed.urls  # nothing the browser would fetch
    engine = sa.create_engine(f"sqlite:///{hub.workdir}/usage.sqlite")
    try:
        today = datetime.now(timezone.utc).date()
        since = today - timedelta(days=29)
        for title, column in (("by user", "user"), ("by donor", "cluster_id")):
            (bars,) = [b for t, b in figures.items() if t.startswith(f"GPU-hours per day {title}")]
            drawn = {(b["data-series"], b["data-category"]): float(b["data-value"]) for b in bars}
            assert drawn == pytest.approx(sql_daily(engine, column, since), abs=1e-5)
        (top,) = [b for t, b in figures.items() if t.startswith("Top users by cost")]
        month = today.strftime("%Y-%m")
        truth = [(u, c) for u, c in sql_month_costs(engine, month) if c > 0][:10]
        assert truth and [(b["data-category"], pytest.approx(float(b["data-value"]), abs=1e-5)) for b in top] == truth
    finally:
        engine.dispose()
