"""Prices and costs carry the chart's offload.currency on the pages and in the GPU profiles."""

from __future__ import annotations

import pytest
from gpu_offload.hub_extension.config import parse_config
from gpu_offload.hub_extension.service import pages
from gpu_offload.hub_extension.service.views import ClusterPageRow
from gpu_offload.hub_extension.spawner.hooks import gpu_profiles
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord

ROW = ClusterPageRow("donor-1", "donor-1", "Provider", "healthy", "", (("offloading", "ok"),), 10.0, 4, 4, 0, 2.5,
                     1, 0)


def _ctx(currency: str) -> pages.HubContext:
    return pages.HubContext("/services/gpu-offload/", "admin", True, "x", True, True, currency)


def test_the_clusters_page_shows_prices_in_the_configured_currency() -> None:
    assert "<td>2.5 EUR</td>" in pages.clusters_page(_ctx("EUR"), [ROW])
    assert "<td>2.5</td>" in pages.clusters_page(_ctx(""), [ROW])  # no currency: a bare number, as before


def test_costs_show_their_currency_and_an_unknown_cost_stays_a_dash() -> None:
    env = pages._ENV
    shown = env.from_string("{{ a | money }}|{{ b | money }}|{{ c | price }}|{{ c | number }}").render(
        a=12.345, b=None, c=2.5, currency="credits")
    assert shown == "12.35 credits|-|2.5 credits|2.5"  # a form field keeps the bare number


def test_the_gpu_profiles_name_the_currency() -> None:
    nodes = (VirtualNodeRecord("d1-a", "d1", 4, 4, 0, model="A100", price=2.5),)
    inventory = Inventory((ClusterRecord("d1", "d1", "provider", "healthy", virtual_nodes=nodes),))
    (_, a100) = gpu_profiles(inventory, "EUR")
    assert "from 2.5 EUR per GPU-hour" in a100["description"]


def test_the_charts_currency_reaches_the_service_and_a_bad_one_is_refused() -> None:
    assert parse_config({"offload": {"currency": "EUR"}}).currency == "EUR"
    assert parse_config({}).currency == ""
    with pytest.raises(InvalidRequest, match="offload.currency="):
        parse_config({"offload": {"currency": "<b>EUR</b>"}})


def test_the_pages_colours_follow_the_hubs_light_or_dark_theme() -> None:
    """JupyterHub's page has a dark theme (Bootstrap's data-bs-theme): the service's own styles use Bootstrap's
    theme variables, never a fixed light background."""
    import re

    html = pages.clusters_page(_ctx(""), [ROW])
    styles = " ".join(re.findall(r"<style>(.*?)</style>", html, re.S))
    assert "var(--bs-success-bg-subtle)" in styles and "var(--bs-danger-text-emphasis)" in styles
    assert not re.search(r"(background|color):#[0-9a-fA-F]{3,6}", styles), styles
