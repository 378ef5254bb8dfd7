"""The admin pages, rendered from the view records with jinja2 templates, autoescaping on. Pure.

The templates (``templates/gpu_offload_*.html``, shipped in the package) extend JupyterHub's own
``page.html``, so the pages carry the hub's navigation bar, CSS and dark mode. Why that and not an own base
template linking the hub's CSS: the service runs in the hub's image, so the ``page.html`` found beside the
installed ``jupyterhub`` is the very one the hub renders, and its stylesheets are those the hub serves at
``<hub>/static/``; the hub's look and navigation come for free and follow hub upgrades, and new pages
(issue 17) only fill ``content``. The price is the context ``page.html`` expects from the hub's own
handlers, built here by ``HubContext``: ``static_url``, ``base_url``, ``user``, ``xsrf_token``, login and
logout URLs. A hub configured with its own ``template_paths`` is not followed (the service cannot see
them). ``page.html`` shows a "requires JavaScript" notice without JavaScript; the pages still work
without it: plain forms, and every write goes through a confirmation page carrying JupyterHub's XSRF token.

Values reach the HTML only through ``{{ }}``, so escaping does not depend on any caller.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jupyterhub
from jupyterhub._data import DATA_FILES_PATH

from ..accounting.store import AuditEntry, UsageTotal
from .queue_page import QueuesView
from .views import ClusterDetail, ClusterPageRow, CostReport, DonorCharts, MyUsage, UsageCharts

TEMPLATES = Path(__file__).parent / "templates"


def age(seconds: float | None) -> str:
    """An age the way kubectl prints it: 45s, 12m, 3h, 5d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(max(seconds, 0))}s"


def _price(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def money(value: float | None) -> str:
    """A cost as the pages show it: two decimals, or two significant digits below 0.1 (a short run's cost)."""
    if value is None:
        return "-"
    return f"{value:.2f}" if value == 0 or abs(value) >= 0.1 else f"{value:.2g}"


def _in_currency(text: str, context: Any) -> str:
    currency = context.get("currency") or ""
    return f"{text} {currency}" if currency and text != "-" else text


@jinja2.pass_context
def _price_shown(context: Any, value: float | None) -> str:
    return _in_currency(_price(value), context)


@jinja2.pass_context
def _money_shown(context: Any, value: float | None) -> str:
    return _in_currency(money(value), context)


def _dash(value: object) -> object:
    return "-" if value is None else value


def _environment() -> jinja2.Environment:
    loader = jinja2.ChoiceLoader([jinja2.FileSystemLoader(TEMPLATES),
                                  jinja2.FileSystemLoader(Path(DATA_FILES_PATH) / "templates")])
    env = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.Undefined)
    # prices and costs carry the chart's offload.currency; "number" is a price as a form field holds it
    env.filters.update(age=age, price=_price_shown, number=_price, dash=_dash, money=_money_shown)
    return env


_ENV = _environment()


def hub_base_url(service_prefix: str) -> str:
    """The hub's public base URL (``/`` by default): JupyterHub's ``JUPYTERHUB_BASE_URL``, else what precedes
    ``services/`` in the service's prefix."""
    base = os.environ.get("JUPYTERHUB_BASE_URL") or service_prefix.split("services/")[0] or "/"
    return base if base.endswith("/") else base + "/"


@dataclass(frozen=True)
class PageUser:
    """What ``page.html`` reads of the signed-in user."""

    name: str

    @property
    def json_escaped_name(self) -> str:
        """The name inside a JavaScript string literal of a <script> (page.html marks it safe): no way out."""
        text = json.dumps(self.name)[1:-1]
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@dataclass(frozen=True)
class HubContext:
    """Who is looking, and where the hub and the service live: what every page needs besides its records."""

    service_prefix: str
    """The service's URL prefix, ends with ``/`` (``/services/gpu-offload/``)."""
    user: str
    admin: bool
    xsrf: str
    """JupyterHub's XSRF token for this browser session; every form carries it."""
    can_manage: bool = False
    can_view: bool = False
    """Whether the admin pages are open to this user (the navigation links them only then)."""
    currency: str = ""
    """The chart's ``offload.currency``: shown after every price and cost (empty: bare numbers)."""

    def variables(self) -> dict[str, Any]:
        """The variables of JupyterHub's ``page.html`` plus the service's own."""
        base = hub_base_url(self.service_prefix)
        hub = f"{base}hub/"

        def static_url(path: str, include_version: bool = True) -> str:
            # the hub serves its static files without login; the version only busts caches on upgrades
            return f"{hub}static/{path}" + (f"?v={jupyterhub.__version__}" if include_version else "")

        return {
            "static_url": static_url, "base_url": hub, "prefix": base, "logo_url": base,
            "login_url": f"{hub}login", "logout_url": f"{hub}logout", "user": PageUser(self.user) if self.user else None,
            "admin_access": self.admin, "parsed_scopes": {"admin-ui"} if self.admin else set(),
            "no_spawner_check": True, "services": [], "xsrf_token": self.xsrf, "version_hash": "",
            "service_prefix": self.service_prefix, "xsrf": self.xsrf, "can_manage": self.can_manage,
            "can_view": self.can_view or self.admin, "currency": self.currency,
        }


def render(template: str, ctx: HubContext, title: str, **values: Any) -> str:
    """``gpu_offload_<template>.html`` filled with ``values``, the hub's page around it."""
    return _ENV.get_template(f"gpu_offload_{template}.html").render(**ctx.variables(), title=title, **values)


def clusters_page(ctx: HubContext, rows: Sequence[ClusterPageRow]) -> str:
    """Every peered cluster with its GPUs, and (for operators) the peering form."""
    return render("clusters", ctx, "Peered clusters", rows=rows)


def cluster_page(ctx: HubContext, detail: ClusterDetail, charts: DonorCharts) -> str:
    """One cluster: its GPUs over the last day and week, its virtual nodes, ResourceSlices and offloaded pods,
    with the node and slice actions."""
    return render("cluster", ctx, f"Cluster {detail.row.name}", detail=detail, charts=charts)


def users_page(ctx: HubContext, totals: Sequence[UsageTotal], report: CostReport, charts: UsageCharts) -> str:
    """Charts of the last days and the month's top users, cost per user and donor of one month, per month, and
    GPU-hours per user and cluster of all time."""
    return render("users", ctx, "GPU usage and cost", totals=totals, report=report, charts=charts)


def my_page(ctx: HubContext, usage: MyUsage) -> str:
    """A user's own: this month's spend and budget, their GPU-hours per day by donor, their last runs."""
    return render("me", ctx, "Your GPU usage", usage=usage)


def queues_page(ctx: HubContext, view: QueuesView) -> str:
    """Kueue's ClusterQueue: quota and usage per flavor, who waits and who holds GPUs, the priority classes."""
    return render("queues", ctx, "Queues", view=view)


def audit_page(ctx: HubContext, entries: Sequence[AuditEntry]) -> str:
    """The most recent admin actions."""
    return render("audit", ctx, "Audit log", entries=entries)


def confirm_page(ctx: HubContext, kind: str, description: str, fields: Mapping[str, str]) -> str:
    """Ask before doing: the action in words, and a button that submits it again with ``confirm=yes``."""
    return render("confirm", ctx, "Confirm", kind=kind, description=description,
                  fields={**fields, "confirm": "yes"})


def result_page(ctx: HubContext, title: str, ok: bool, message: str, command: str = "") -> str:
    """What happened, in words."""
    return render("result", ctx, title, ok=ok, message=message, command=command)
