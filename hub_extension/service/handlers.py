"""Tornado handlers of the service: admin pages, their JSON API, and the user-scoped endpoints.

Who may do what (JupyterHub's OAuth decides who someone is, these handlers decide what they may see):
- admin pages and ``/api/admin/...``: the hub's access scope for this service, then ``custom:gpu-offload:view``
  to read and ``custom:gpu-offload:manage`` to write; JupyterHub admins pass as operators;
- ``/api/inventory`` and ``/api/me``: any hub user or server token (the magic calls them);
- ``/metrics``: as JupyterHub's own: a token with ``read:metrics`` (or the view scope), else 403; open to
  anyone only with the chart's ``metrics.open``.
XSRF: JupyterHub's HubOAuth refuses a cookie-authenticated POST without its XSRF token, so every form
carries its token (``HubContext.xsrf``); token-authenticated API calls need none.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpu_offload.liqo_peering.errors import GpuOffloadError, InvalidRequest
from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from ..accounting import billing
from . import pages, views
from .actions import Action, Peering, parse_action
from .bodies import Body
from .operations import ActionResult, Operations
from .state import HubState
from .uploads import KubeconfigVault

VIEW_SCOPE = "custom:gpu-offload:view"
MANAGE_SCOPE = "custom:gpu-offload:manage"
METRICS_SCOPE = "read:metrics"
"""JupyterHub's scope for its own /metrics; a Prometheus token made for the hub's metrics works here too."""


def may(model: dict[str, Any] | None, scope: str) -> bool:
    """Whether the hub user ``model`` holds ``scope``; admins hold both of the service's scopes."""
    if not model:
        return False
    if model.get("admin"):
        return True
    held = set(model.get("scopes") or ())
    return scope in held or (scope == VIEW_SCOPE and MANAGE_SCOPE in held)


class Base(HubOAuthenticated, web.RequestHandler):
    """Shared plumbing: the state, the operations, the service prefix, errors in words."""

    def initialize(self, state: HubState, operations: Operations, prefix: str, vault: KubeconfigVault) -> None:
        self.state = state
        self.operations = operations
        self.prefix = prefix
        self.vault = vault

    async def prepare(self) -> None:
        # JupyterHub's mixin resolves the user in get_current_user, which blocks the event loop on a one-thread
        # pool: every request waits its turn there, and a token missing HubAuth's cache holds the whole service
        # while the hub answers. Ask asynchronously instead (the same HubAuth, its token cache and XSRF checks);
        # tornado then never calls get_current_user.
        self.current_user = await self._hub_user()

    async def _hub_user(self) -> dict[str, Any] | None:
        """What ``HubAuthenticated.get_current_user`` decides, awaited: the allowed hub user, else None."""
        model = await self.hub_auth.get_user(self, sync=False)
        if not model:
            return None
        try:
            allowed: dict[str, Any] | None = self.check_hub_user(model)
        except UserNotAllowed:
            # as JupyterHub does: known but lacking the service's access scope is a 403, not a login redirect
            def refuse(*args: Any, **kwargs: Any) -> None:
                raise web.HTTPError(403, f"{model.get('kind', 'user')} {model.get('name')} is not allowed.")
            self.redirect = refuse  # type: ignore[method-assign]
            return None
        self.hub_auth._persist_url_token_if_set(self)
        return allowed

    @property
    def user_name(self) -> str:
        """Name of the signed-in hub user (or service)."""
        return str((self.current_user or {}).get("name") or "")

    def require(self, scope: str) -> None:
        """403 unless the current user holds ``scope``."""
        if not may(self.current_user, scope):
            role = "gpu-offload-operator" if scope == MANAGE_SCOPE else "gpu-offload-viewer"
            raise web.HTTPError(403, f"{self.user_name or 'you'} lacks the scope {scope}; ask a hub admin for the "
                                     f"{role} role")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Words, never a traceback: the reason the handler gave, or the standard phrase.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, GpuOffloadError):  # e.g. the inventory cache cannot reach the API yet
            message = f"{exc}"
        else:
            message = getattr(exc, "log_message", None) or self._reason
        if self.request.path.startswith(f"{self.prefix}api/"):
            self.finish({"error": message, "status": status_code})
        else:
            self.finish(pages.result_page(self.page_context(), f"Error {status_code}", False, message))

    def page_context(self) -> pages.HubContext:
        """Who is looking and where: what every page needs besides its records."""
        model = self.current_user or {}
        return pages.HubContext(self.prefix, self.user_name, bool(model.get("admin")), self.xsrf_token.decode(),
                                may(model, MANAGE_SCOPE), may(model, VIEW_SCOPE), self.state.config.currency)


class PageHandler(Base):
    """An admin page: a GET needs the view scope, then :meth:`page` renders it (one check for every page)."""

    @web.authenticated
    def get(self, *args: str) -> None:
        self.require(VIEW_SCOPE)
        self.finish(self.page(*args))

    def page(self, *args: Any, **kwargs: Any) -> str:
        """The page's HTML for the URL's arguments."""
        raise NotImplementedError


class ClustersPage(PageHandler):
    def page(self) -> str:
        return pages.clusters_page(self.page_context(), self.state.cluster_rows())


class ClusterPage(PageHandler):
    def page(self, key: str) -> str:
        detail = self.state.cluster_detail(key)
        if detail is None:
            raise web.HTTPError(404, f"no peered cluster {key!r}; pick one from the clusters page")
        return pages.cluster_page(self.page_context(), detail, self.state.donor_charts(detail.row.cluster_id))


def month_argument(handler: web.RequestHandler) -> str | None:
    """The ``month`` query argument (``YYYY-MM``), None when absent; a 400 naming the form otherwise."""
    month = handler.get_query_argument("month", "") or None
    if month is not None and not billing.MONTH.fullmatch(month):
        raise web.HTTPError(400, f"month={month[:16]!r} is not a month; write it like 2026-11 (UTC), or leave it out "
                                 "for all months")
    return month


class UsersPage(PageHandler):
    def page(self) -> str:
        month = month_argument(self) or views.this_month()
        return pages.users_page(self.page_context(), *self.state.usage_page(month))


class QueuesPage(PageHandler):
    def page(self) -> str:
        return pages.queues_page(self.page_context(), self.state.queues_view())


class AuditPage(PageHandler):
    def page(self) -> str:
        return pages.audit_page(self.page_context(), self.state.store.audit_log())


def _form(handler: web.RequestHandler) -> dict[str, str]:
    fields = {k: handler.get_body_argument(k) for k in handler.request.body_arguments if k != "_xsrf"}
    for name, files in handler.request.files.items():
        if files and files[0]["body"]:
            fields[name] = files[0]["body"].decode("utf-8", errors="replace")
    return fields


class ActionPage(Base):
    """POST a form: the first time shows what will happen, with ``confirm=yes`` it happens."""

    @web.authenticated
    async def post(self, kind: str) -> None:
        self.require(MANAGE_SCOPE)
        fields = _form(self)
        confirm = fields.pop("confirm", "")
        try:
            if confirm not in ("", "yes"):
                raise InvalidRequest(f"confirm={confirm[:16]!r}: the only value is yes, sent by the Confirm button")
            action = parse_action(kind, self._with_upload(kind, fields))
        except InvalidRequest as exc:
            self.set_status(400)
            self.finish(pages.result_page(self.page_context(), "Not done", False, str(exc)))
            return
        if confirm != "yes":
            carried = action.form_fields()
            if isinstance(action, Peering) and action.kubeconfig:
                carried["kubeconfig_token"] = self.vault.hold(self.user_name, kind, action.cluster_id,
                                                              action.kubeconfig)
            self.finish(pages.confirm_page(self.page_context(), kind, action.describe(), carried))
            return
        outcome = await self._apply(action)
        self.set_status(200 if outcome.ok else 409)
        self.finish(pages.result_page(self.page_context(), "Done" if outcome.ok else "Not done", outcome.ok,
                                      outcome.message, outcome.command))

    def _with_upload(self, kind: str, fields: dict[str, str]) -> dict[str, str]:
        """``fields`` with the kubeconfig a ``kubeconfig_token`` stands for (the token is then spent)."""
        token = fields.pop("kubeconfig_token", "").strip()
        if token:
            cluster_id = fields.get("cluster_id", "").strip()
            fields = {**fields, "kubeconfig": self.vault.redeem(token, self.user_name, kind, cluster_id)}
        return fields

    async def _apply(self, action: Action) -> ActionResult:
        # liqoctl and API calls block: keep the service's event loop (and the other pages) responsive.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.operations.apply, action, self.user_name, self.state.facts())


class JsonHandler(Base):
    def send(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def send_body(self, body: Body) -> None:
        """A kept body (bodies.py), or 304 when the client holds it already (``If-None-Match``). Call it only
        after the caller's right to the body was checked: a 304 says as much as the body."""
        self.set_header("Content-Type", "application/json")
        self.set_header("Etag", body.etag)  # set here, tornado would hash the body again in finish()
        if self.check_etag_header():
            self.set_status(304)
            self.finish()
            return
        self.finish(body.data)


class AdminApi(JsonHandler):
    """A read of the admin API: a GET needs the view scope, then :meth:`data` answers it (a kept body, or what
    becomes JSON)."""

    @web.authenticated
    def get(self, *args: str) -> None:
        self.require(VIEW_SCOPE)
        data = self.data(*args)
        if isinstance(data, Body):
            self.send_body(data)
        else:
            self.send(data)

    def data(self, *args: Any, **kwargs: Any) -> Any:
        """The answer for the URL's arguments."""
        raise NotImplementedError


class ClustersApi(AdminApi):
    def data(self) -> Body:
        return self.state.clusters_body()


class ClusterApi(AdminApi):
    def data(self, key: str) -> Any:
        detail = self.state.cluster_detail(key)
        if detail is None:
            raise web.HTTPError(404, f"no peered cluster {key!r}; GET api/admin/clusters lists them")
        return views.to_json(detail)


class UsageApi(AdminApi):
    def data(self) -> Any:
        return {"usage": views.to_json(self.state.store.totals())}


class CostApi(AdminApi):
    """Cost per user and per donor (of ``?month=YYYY-MM``, else of all months), and per month."""

    def data(self) -> Any:
        return views.to_json(self.state.cost_report(month_argument(self)))


class BillingCsv(Base):
    """Every finished run (of ``?month=YYYY-MM``, else all) with its price and cost, as CSV for billing."""

    @web.authenticated
    async def get(self) -> None:
        self.require(VIEW_SCOPE)
        month = month_argument(self)
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        name = f"gpu-offload-usage-{month or 'all'}.csv"
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        for chunk in billing.csv_chunks(self.state.store.export(month)):
            self.write(chunk)
            await self.flush()
        self.finish()


class QueuesApi(AdminApi):
    def data(self) -> Any:
        return views.to_json(self.state.queues_view())


class AuditApi(AdminApi):
    def data(self) -> Any:
        return {"audit": views.to_json(list(self.state.store.audit_log()))}


class ActionApi(JsonHandler, ActionPage):
    """POST a JSON body; ``"confirm": true`` is required, else the answer says what would happen."""

    @web.authenticated
    async def post(self, kind: str) -> None:
        self.require(MANAGE_SCOPE)
        try:
            body = json.loads(self.request.body or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not an object")
            action = parse_action(kind, {k: v for k, v in body.items() if k != "confirm"})
        except (ValueError, GpuOffloadError) as exc:
            raise web.HTTPError(400, f"{exc}") from None
        except RecursionError:  # json.loads on deeply nested input
            raise web.HTTPError(400, "the body nests too deeply; send a flat JSON object of fields") from None
        if body.get("confirm") is not True:
            self.set_status(400)
            self.send({"error": f"confirm: add \"confirm\": true to {action.describe()}", "status": 400})
            return
        outcome = await self._apply(action)
        self.set_status(200 if outcome.ok else 409)
        self.send({"ok": outcome.ok, "message": outcome.message, "command": outcome.command,
                   **({"peering": True} if isinstance(action, Peering) else {})})


class UserHandler(JsonHandler):
    """Endpoints any hub user (or their server's token) may call: no service access scope needed."""

    @property
    def hub_scopes(self) -> None:  # type: ignore[override]
        return None

    def own_runs_only(self) -> None:
        """403 when the request names another user: what these endpoints show is the caller's, always."""
        for asked in self.get_query_arguments("user"):
            if asked != self.user_name:
                    raise web.HTTPError(403, f"you are {self.user_name!r}: this shows your own runs only, not "
                                         f"{asked[:64]!r}'s; leave out ?user= (viewers of the service see everyone's "
                                         "on its users page)")


class InventoryApi(UserHandler):
    @web.authenticated
    def get(self) -> None:
        self.send_body(self.state.inventory_body())


class MyRunsApi(UserHandler):
    @web.authenticated
    def get(self) -> None:
        self.own_runs_only()
        self.send(self.state.user_runs(self.user_name))


class MyPage(UserHandler):
    """The caller's own GPU usage as a page: the month's spend, the chart of their runs, their last runs."""

    @web.authenticated
    def get(self) -> None:
        self.own_runs_only()
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(pages.my_page(self.page_context(), self.state.my_usage(self.user_name)))


class MetricsHandler(UserHandler):
    """Prometheus' text format. Like JupyterHub's ``authenticate_prometheus``: 403 without a token holding
    ``read:metrics`` or the view scope (a scraper gets no login redirect), unless the chart opened it."""

    def get(self) -> None:
        if not self.state.config.metrics_open:
            model = self.current_user
            if not (may(model, VIEW_SCOPE) or METRICS_SCOPE in set((model or {}).get("scopes") or ())):
                raise web.HTTPError(403, f"{self.user_name or 'a request without a token'}: /metrics needs an API "
                                         f"token with the scope {METRICS_SCOPE} or {VIEW_SCOPE} (Authorization: "
                                         "Bearer <token>), or the chart value metrics.open: true")
        body = generate_latest(self.state.metrics.registry)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)
