"""Tornado handlers of the service: admin pages, their JSON API, and the user-scoped endpoints.

Who may do what (JupyterHub's OAuth decides who someone is, these handlers decide what they may see):
- admin pages and ``/api/admin/...``: the hub's access scope for this service, then ``custom:gpu-offload:view``
  to read and ``custom:gpu-offload:manage`` to write; JupyterHub admins pass as operators;
- ``/api/inventory`` and ``/api/me``: any hub user or server token (the magic calls them).
XSRF: JupyterHub's HubOAuth refuses a cookie-authenticated POST without its XSRF token, so every form
carries ``xsrf_form_html()``; token-authenticated API calls need none.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpu_offload.liqo_peering.errors import GpuOffloadError, InvalidRequest
from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from . import pages, views
from .actions import Action, Peering, parse_action
from .operations import Operations, Outcome
from .state import HubState

VIEW_SCOPE = "custom:gpu-offload:view"
MANAGE_SCOPE = "custom:gpu-offload:manage"


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

    def initialize(self, state: HubState, operations: Operations, prefix: str) -> None:
        self.state = state
        self.operations = operations
        self.prefix = prefix

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
            self.finish(pages.layout(f"Error {status_code}", pages.result_page(False, message, self.prefix),
                                     self.prefix, self.user_name))


class PageHandler(Base):
    """Admin pages: need the view scope."""

    def page(self, title: str, body: str) -> None:
        self.finish(pages.layout(title, body, self.prefix, self.user_name))

    @property
    def can_manage(self) -> bool:
        return may(self.current_user, MANAGE_SCOPE)


class ClustersPage(PageHandler):
    @web.authenticated
    def get(self) -> None:
        self.require(VIEW_SCOPE)
        self.page("Peered clusters", pages.clusters_page(self.state.cluster_rows(), self.prefix, self.can_manage,
                                                        self.xsrf_form_html()))


class ClusterPage(PageHandler):
    @web.authenticated
    def get(self, key: str) -> None:
        self.require(VIEW_SCOPE)
        detail = self.state.cluster_detail(key)
        if detail is None:
            raise web.HTTPError(404, f"no peered cluster {key!r}; pick one from the clusters page")
        self.page(f"Cluster {detail.row.name}", pages.cluster_page(detail, self.prefix, self.can_manage,
                                                                   self.xsrf_form_html()))


class UsersPage(PageHandler):
    @web.authenticated
    def get(self) -> None:
        self.require(VIEW_SCOPE)
        self.page("GPU usage per user", pages.users_page(self.state.store.totals()))


class AuditPage(PageHandler):
    @web.authenticated
    def get(self) -> None:
        self.require(VIEW_SCOPE)
        self.page("Audit log", pages.audit_page(self.state.store.audit_log()))


def _form(handler: web.RequestHandler) -> dict[str, str]:
    fields = {k: handler.get_body_argument(k) for k in handler.request.body_arguments if k != "_xsrf"}
    for name, files in handler.request.files.items():
        if files and files[0]["body"]:
            fields[name] = files[0]["body"].decode("utf-8", errors="replace")
    return fields


class ActionPage(PageHandler):
    """POST a form: the first time shows what will happen, with ``confirm=yes`` it happens."""

    @web.authenticated
    async def post(self, kind: str) -> None:
        self.require(MANAGE_SCOPE)
        fields = _form(self)
        try:
            action = parse_action(kind, fields)
        except InvalidRequest as exc:
            self.set_status(400)
            self.page("Not done", pages.result_page(False, str(exc), self.prefix))
            return
        if fields.get("confirm") != "yes":
            self.page("Confirm", pages.confirm_page(self.prefix, kind, action.describe(), fields,
                                                    self.xsrf_form_html()))
            return
        outcome = await self._apply(action)
        self.set_status(200 if outcome.ok else 409)
        self.page("Done" if outcome.ok else "Not done",
                  pages.result_page(outcome.ok, outcome.message, self.prefix, outcome.command))

    async def _apply(self, action: Action) -> Outcome:
        # liqoctl and API calls block: keep the service's event loop (and the other pages) responsive.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.operations.apply, action, self.user_name, self.state.facts())


class JsonHandler(Base):
    def send(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))


class ClustersApi(JsonHandler):
    @web.authenticated
    def get(self) -> None:
        self.require(VIEW_SCOPE)
        self.send({"clusters": views.to_json(self.state.cluster_rows())})


class ClusterApi(JsonHandler):
    @web.authenticated
    def get(self, key: str) -> None:
        self.require(VIEW_SCOPE)
        detail = self.state.cluster_detail(key)
        if detail is None:
            raise web.HTTPError(404, f"no peered cluster {key!r}; GET api/admin/clusters lists them")
        self.send(views.to_json(detail))


class UsageApi(JsonHandler):
    @web.authenticated
    def get(self) -> None:
        self.require(VIEW_SCOPE)
        self.send({"usage": views.to_json(self.state.store.totals())})


class AuditApi(JsonHandler):
    @web.authenticated
    def get(self) -> None:
        self.require(VIEW_SCOPE)
        self.send({"audit": views.to_json(list(self.state.store.audit_log()))})


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


class InventoryApi(UserHandler):
    @web.authenticated
    def get(self) -> None:
        self.send(views.user_inventory(self.state.inventory()))


class MyRunsApi(UserHandler):
    @web.authenticated
    def get(self) -> None:
        self.send(self.state.user_runs(self.user_name))
