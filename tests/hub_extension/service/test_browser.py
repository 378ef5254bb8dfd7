"""The proof in a real browser: Debian's Chromium through Playwright, against a real JupyterHub, the
service and the sandbox origin with two donors. Screenshots go to test-artifacts/hub_extension/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.placement import PlacementRequest, place
from gpu_offload.sandbox.liqo.origin import RunningOrigin

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic", "--no-first-run",
        "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium missing: tests/run.sh installs it")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


def log_in(browser: Any, hub: Any, user: str) -> Any:
    """A fresh browser context logged in as ``user`` (the dummy authenticator takes any password)."""
    context = browser.new_context()
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(f"{hub.url}hub/login?next=%2Fhub%2Fhome")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", "any password")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(r".*/hub/home.*"))
    return page


def cluster_row(page: Any, cluster: str) -> list[str]:
    """The cells of ``cluster``'s row on the clusters page."""
    row = page.locator("tr", has=page.locator(f"a:text-is('{cluster}')"))
    return [cell.strip() for cell in row.locator("td").all_inner_texts()]


def test_admin_cordons_a_donor_and_placement_avoids_it(browser: Any, hub: Any, origin: RunningOrigin,
                                                       artifacts: Path) -> None:
    page = log_in(browser, hub, "admin")
    assert page.locator('a[href*="/services/gpu-offload/"]').count() >= 1  # listed for those with access
    page.goto(hub.service_url)
    page.wait_for_selector("h1:text('Peered clusters')")
    # headers: Cluster, Role, Health, Modules, Age, GPUs total, GPUs free, GPUs in use, Price, Cordon
    for donor in ("donor-1", "donor-2"):
        cells = cluster_row(page, donor)
        assert cells[0] == donor and cells[5] == "4" and cells[6] == "4" and cells[9] == "schedulable", cells
    page.screenshot(path=str(artifacts / "1-admin-clusters.png"), full_page=True)

    page.click("a:text-is('donor-1')")
    page.wait_for_selector("h1:text('Cluster donor-1')")
    page.click("button:text('Cordon…')")
    page.wait_for_selector("text=You are about to")
    assert "cordon virtual node donor-1-gpu" in page.inner_text("body")
    page.screenshot(path=str(artifacts / "2-admin-confirm-cordon.png"), full_page=True)
    page.click("button:text('Confirm')")
    assert "virtual node donor-1-gpu cordoned" in page.inner_text("#result")

    page.goto(hub.service_url)
    assert cluster_row(page, "donor-1")[9] == "1 cordoned"
    assert cluster_row(page, "donor-2")[9] == "schedulable"
    page.screenshot(path=str(artifacts / "3-admin-donor-1-cordoned.png"), full_page=True)
    inventory = LiqoClient(origin.sandbox.api_client()).read_inventory()
    assert {place(inventory, PlacementRequest(gpus=g)).cluster_id for g in (1, 2, 4)} == {"donor-2"}

    # a form post without JupyterHub's XSRF token is refused, and changes nothing
    forged = page.request.post(f"{hub.service_url}actions/uncordon", multipart={
        "cluster_id": "donor-1", "node": "donor-1-gpu", "confirm": "yes"}, max_redirects=0)
    assert forged.status == 403
    page.goto(hub.service_url)
    assert cluster_row(page, "donor-1")[9] == "1 cordoned"

    page.click("a:text-is('donor-1')")
    page.click("button:text('Uncordon…')")
    page.click("button:text('Confirm')")
    assert "uncordoned" in page.inner_text("#result")
    page.goto(f"{hub.service_url}audit")
    audit = page.inner_text("table")
    assert "cordon" in audit and "uncordon" in audit and "admin" in audit
    page.screenshot(path=str(artifacts / "4-admin-audit.png"), full_page=True)
    page.context.close()


def test_a_plain_user_sees_no_link_and_gets_403(browser: Any, hub: Any, artifacts: Path) -> None:
    page = log_in(browser, hub, "alice")
    assert page.locator('a[href*="/services/gpu-offload/"]').count() == 0
    page.screenshot(path=str(artifacts / "5-user-home-no-link.png"), full_page=True)
    answer = page.goto(hub.service_url)
    assert answer is not None and answer.status == 403
    page.screenshot(path=str(artifacts / "6-user-403.png"), full_page=True)
    page.context.close()


def test_admin_uploads_a_kubeconfig_to_peer_and_is_shown_the_command(browser: Any, hub: Any, artifacts: Path,
                                                                     tmp_path: Path) -> None:
    kubeconfig = tmp_path / "donor-3.yaml"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n")
    page = log_in(browser, hub, "admin")
    page.goto(hub.service_url)
    form = page.locator("form[action$='actions/peer']")
    form.locator("input[name=cluster_id]").fill("donor-3")
    form.locator("input[name=kubeconfig]").set_input_files(str(kubeconfig))
    form.locator("button").click()
    page.wait_for_selector("text=You are about to")
    assert "peer cluster donor-3 with liqoctl" in page.inner_text("body")
    page.click("button:text('Confirm')")
    assert "peering.liqoctlEnabled is false" in page.inner_text("#result")
    assert page.inner_text("pre") == "liqoctl peer --remote-kubeconfig '<kubeconfig of cluster donor-3>'"
    page.screenshot(path=str(artifacts / "7-admin-peer-command.png"), full_page=True)
    page.context.close()


def test_admin_labels_a_virtual_node_from_its_cluster_page(browser: Any, hub: Any, artifacts: Path) -> None:
    page = log_in(browser, hub, "admin")
    page.goto(f"{hub.service_url}clusters/donor-2")
    form = page.locator("form[action$='actions/label']")
    form.locator("input[name=model]").fill("H100")
    form.locator("input[name=price]").fill("3.75")
    form.locator("button").click()
    page.click("button:text('Confirm')")
    try:
        assert "labelled GPU model H100, 3.75 per GPU-hour" in page.inner_text("#result")
    finally:  # the seeded model and price back: a module sharing the origin reads donor-2's price
        restored = hub.api("POST", "api/admin/actions/label", "admin", {
            "cluster_id": "donor-2", "node": "donor-2-gpu", "model": "A100", "price": "2.25", "confirm": True})
        assert restored.status == 200, restored.text
    bad = page.goto(f"{hub.service_url}clusters/donor-2")
    assert bad is not None
    form = page.locator("form[action$='actions/label']")
    form.locator("input[name=price]").fill("cheap")
    form.locator("button").click()
    assert "decimal number" in page.inner_text("#result")  # refused in words before any confirmation
    page.screenshot(path=str(artifacts / "8-admin-label-refused.png"), full_page=True)
    page.context.close()


def _run_briefly(origin: RunningOrigin, hub: Any, user: str, pod: str, done: Path) -> None:
    """``user`` runs a 2-GPU pod on donor-1 for a few seconds; returns once the service has recorded it."""
    import kubernetes
    from gpu_offload.sandbox.fixtures import wait_until

    from ..conftest import held_pod, offloaded_namespace

    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    try:
        core.create_namespaced_pod(ns, held_pod(pod, user, "donor-1", done, gpus=2))
        started_pod = wait_until(lambda: (p := core.read_namespaced_pod(pod, ns)).status.phase == "Running" and p,
                                 "the run to start")
        # pod times have one-second precision: a run ended within its first second would meter 0 GPU-seconds
        # and draw no bar, so it ends once the clock has passed its start by two seconds
        started = started_pod.status.start_time or started_pod.metadata.creation_timestamp
        wait_until(lambda: datetime.now(timezone.utc) >= started + timedelta(seconds=2), "the clock to pass the start")
        done.touch()
        wait_until(lambda: [r for r in hub.api("GET", "api/me", user).json()["finished"] if r["pod"] == pod],
                   "the run to be recorded")
    finally:
        done.touch()
        core.delete_namespace(ns)
        client.close()


def test_the_users_page_shows_cost_and_charts_at_desktop_and_narrow_widths(
        browser: Any, hub: Any, origin: RunningOrigin, artifacts: Path, tmp_path: Path) -> None:
    _run_briefly(origin, hub, "alice", "gpuo-shown", tmp_path / "done")
    page = log_in(browser, hub, "vera")
    for width, name in ((1280, "9-viewer-users-cost-1280.png"), (600, "10-viewer-users-cost-600.png")):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{hub.service_url}users")
        page.wait_for_selector("h1:text('GPU usage and cost')")
        charts = page.locator("figure.gpu-offload-chart svg[role=img]")
        assert charts.count() == 3
        for i in range(3):  # the charts shrink with the window: none wider than it
            box = charts.nth(i).bounding_box()
            assert box is not None and 0 < box["width"] <= width
        assert page.locator("rect.bar[data-series='alice']").count() >= 1
        assert "alice" in page.inner_text("table")
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows, the menu neither
        page.screenshot(path=str(artifacts / name), full_page=True)
    page.context.close()


def test_a_cluster_page_charts_its_gpus_at_desktop_and_narrow_widths(browser: Any, hub: Any, artifacts: Path
                                                                     ) -> None:
    page = log_in(browser, hub, "vera")
    for width, name in ((1280, "11-viewer-cluster-gpus-1280.png"), (600, "12-viewer-cluster-gpus-600.png")):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{hub.service_url}clusters/donor-1")
        page.wait_for_selector("h2:text('GPUs over time')")
        charts = page.locator("figure.gpu-offload-chart svg[role=img]")
        assert charts.count() == 2  # the day and the week: the service sampled donor-1 since it started
        for i in range(2):
            box = charts.nth(i).bounding_box()
            assert box is not None and 0 < box["width"] <= width
        assert page.locator("rect.bar[data-series='free'], rect.bar[data-series='in use']").count() >= 2
        page.screenshot(path=str(artifacts / name), full_page=True)
    page.context.close()


def test_a_user_sees_their_own_chart_at_desktop_and_narrow_widths(browser: Any, hub: Any, origin: RunningOrigin,
                                                                 artifacts: Path, tmp_path: Path) -> None:
    _run_briefly(origin, hub, "vera", "gpuo-veras", tmp_path / "done")
    page = log_in(browser, hub, "vera")
    for width, name in ((1280, "13-user-own-usage-1280.png"), (600, "14-user-own-usage-600.png")):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{hub.service_url}me")
        page.wait_for_selector("h1:text('Your GPU usage')")
        chart = page.locator("figure.gpu-offload-chart svg[role=img]")
        assert chart.count() == 1
        box = chart.bounding_box()
        assert box is not None and 0 < box["width"] <= width  # it shrinks with the window
        assert page.locator("rect.bar[data-series='donor-1']").count() >= 1
        assert "gpuo-veras" in page.inner_text("table") and "gpuo-shown" not in page.content()  # alice's run
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows, the menu neither
        page.screenshot(path=str(artifacts / name), full_page=True)
    page.context.close()
