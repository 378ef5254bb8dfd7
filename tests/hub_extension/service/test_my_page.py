"""A user's own page (``me``) on the real hub's service: their GPU-hours per day by donor as inline SVG whose
bars are what the service's database holds for them, nothing of anyone else's whatever the URL says, nothing
fetched from elsewhere, and an empty state that says what to do."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Any

import pytest
import sqlalchemy as sa
from gpu_offload.hub_extension.accounting.cost import priced
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.accounting.usage import MeteredRun

from ..accounting.test_cost_service import _Svg


class _Links(HTMLParser):
    """Every address the page makes the browser load (scripts, styles, images, frames)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag in ("script", "img", "iframe", "source", "image", "use") and found.get("src"):
            self.loaded.append(found["src"])
        if tag == "link" and {"stylesheet", "icon"} & set(found.get("rel", "").split()):
            self.loaded.append(found.get("href", ""))
        self.loaded += [v for v in found.values() if "url(" in v]


NOW = datetime.now(timezone.utc).replace(microsecond=0)
RUNS = [  # (uid, user, donor, ended days ago, hours, GPUs)
    ("me-a1", "alice", "donor-1", 0, 1.0, 2), ("me-a2", "alice", "donor-2", 0, 0.5, 1),
    ("me-a3", "alice", "donor-1", 3, 2.0, 1), ("me-a4", "alice", "donor-2", 45, 1.0, 1),  # too old for the chart
    ("me-v1", "vera", "donor-1", 0, 4.0, 4), ("me-v2", "vera", "donor-3", 1, 1.0, 1),  # donor-3: only vera's
]


@pytest.fixture(scope="module")
def recorded(hub: Any) -> Any:
    """The runs above, recorded into the service's own database as its meter records runs (priced)."""
    store = Store(f"sqlite:///{hub.workdir}/usage.sqlite")
    try:
        store.note_prices({("donor-1", "donor-1-gpu"): 2.0}, NOW - timedelta(days=60))
        for uid, user, donor, days_ago, hours, gpus in RUNS:
            ended = NOW - timedelta(days=days_ago, minutes=5)
            run = MeteredRun(uid, f"jhub-{user}", f"gpuo-{uid}", user, donor, f"{donor}-gpu", gpus,
                             ended - timedelta(hours=hours), ended, "Succeeded")
            store.record_run(priced(run, store.price_book(donor, run.node)))
    finally:
        store.close()
    return hub


def _bars(page: str) -> dict[tuple[str, str], float]:
    parsed = _Svg()
    parsed.feed(page)
    assert not parsed.urls
    ((title, bars),) = parsed.figures
    assert title.startswith("Your GPU-hours per day by donor")
    return {(b["data-series"], b["data-category"]): float(b["data-value"]) for b in bars}


def _truth(hub: Any, user: str) -> dict[tuple[str, str], float]:
    """GPU-hours per (donor, day) of ``user``'s runs of the last 30 days, in SQL written here."""
    since = (NOW.date() - timedelta(days=29)).isoformat()
    engine = sa.create_engine(f"sqlite:///{hub.workdir}/usage.sqlite")
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT cluster_id, date(ended), sum(gpu_seconds) / 3600.0 FROM "
                                        "gpu_offload_runs WHERE user = :u AND date(ended) >= :since GROUP BY 1, 2"),
                                {"u": user, "since": since})
            return {(str(k), str(d)): float(v) for k, d, v in rows}
    finally:
        engine.dispose()


def test_a_users_page_charts_their_own_runs_as_the_database_holds_them(recorded: Any) -> None:
    page = recorded.api("GET", "me", "alice")
    assert page.status == 200 and page.headers.get("content-type", "").startswith("text/html")
    truth = _truth(recorded, "alice")
    assert _bars(page.text) == pytest.approx(truth, abs=1e-5)
    assert len(truth) == 3  # three (donor, day) pairs: the 45-day-old run is not drawn
    assert "gpuo-me-a4" in page.text  # but it is among her last runs
    for theirs in ("gpuo-me-v1", "gpuo-me-v2", "donor-3"):  # nothing of vera's
        assert theirs not in page.text
    links = _Links()
    links.feed(page.text)
    prefix = recorded.url.split("//", 1)[1].split("/", 1)[1]  # the hub's base path, "" here
    assert links.loaded and all(u.startswith(f"/{prefix}") and not u.startswith("//") for u in links.loaded)
    vera = recorded.api("GET", "me", "vera")
    assert _bars(vera.text) == pytest.approx(_truth(recorded, "vera"), abs=1e-5)
    assert "gpuo-me-a1" not in vera.text


def test_naming_another_user_in_the_url_shows_nothing_of_theirs(recorded: Any) -> None:
    for path in ("me?user=vera", "api/me?user=vera", "me?user=vera&user=alice"):
        answer = recorded.api("GET", path, "alice")
        assert answer.status == 403, path
        assert "your own runs only" in answer.text and "gpuo-me-v1" not in answer.text
    assert recorded.api("GET", "me/vera", "alice").status == 404
    own = recorded.api("GET", "me?user=alice", "alice")  # naming oneself is harmless
    assert own.status == 200 and "gpuo-me-a1" in own.text
    mine = recorded.api("GET", "api/me", "alice").json()
    assert {r["pod"] for r in mine["finished"]} >= {"gpuo-me-a1"} and not {
        r["pod"] for r in mine["finished"] if r["user"] != "alice"}


def test_a_user_without_runs_is_told_how_to_start_one(recorded: Any) -> None:
    page = recorded.api("GET", "me", "admin")  # the admin ran nothing
    assert page.status == 200
    parsed = _Svg()
    parsed.feed(page.text)
    assert parsed.figures == [(parsed.figures[0][0], [])]
    assert "No run ended in the last 30 days. Put %%gpu_offload on top of a notebook cell" in page.text


def test_a_part_of_a_gpu_is_shown_and_charged_as_that_part(recorded: Any) -> None:
    store = Store(f"sqlite:///{recorded.workdir}/usage.sqlite")
    try:
        ended = NOW - timedelta(minutes=5)
        # alice's: the hub knows its users; (donor-1, today) is already among her chart's bars
        run = MeteredRun("me-f1", "jhub-alice", "gpuo-me-f1", "alice", "donor-1", "donor-1-gpu", 1,
                         ended - timedelta(hours=2), ended, "Succeeded", share=0.25)
        store.record_run(priced(run, store.price_book("donor-1", run.node)))
    finally:
        store.close()
    page = recorded.api("GET", "me", "alice")
    assert page.status == 200
    row = page.text[page.text.index("gpuo-me-f1"):].split("</tr>")[0]
    assert "<td>0.25</td><td>0.500</td>" in row  # a quarter of a GPU for two hours: half a GPU-hour
    (finished,) = [r for r in recorded.api("GET", "api/me", "alice").json()["finished"] if r["pod"] == "gpuo-me-f1"]
    assert (finished["share"], finished["gpu_seconds"], finished["cost"]) == (0.25, 1800.0, 1.0)  # at 2.0
