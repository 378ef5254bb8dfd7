"""HTTP routing for the resource API: ``/api/v1/...`` and ``/apis/<group>/<version>/...`` onto :class:`Api`.

One catch-all route parses the path the way kube-apiserver lays it out (cluster-scoped, namespaced,
all-namespaces, subresources, and the legacy ``/watch/`` prefix) and dispatches on the HTTP method.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import eviction, fieldvalidation, listoptions, paging, tables, watch_http
from .api import Api
from .errors import NOT_FOUND, ApiError, bad_request, method_not_allowed
from .pod_http import pod_attach_or_exec, pod_binding, pod_log, pod_port_forward
from .resources import ResourceType
from .selectors import Selector


@dataclass(frozen=True)
class Target:
    """What a resource URL names."""

    rt: ResourceType
    namespace: str | None  # None: cluster-scoped object, or every namespace for a list
    name: str = ""
    subresource: str = ""
    watch: bool = False


def parse_target(api: Api, group: str, version: str, segs: list[str]) -> Target:
    """Resolve the path segments after ``/api/v1`` or ``/apis/g/v``; 404 for unknown resources."""
    watch = bool(segs) and segs[0] == "watch"
    if watch:
        segs = segs[1:]
    if len(segs) >= 3 and segs[0] == "namespaces" and api.registry.lookup(group, version, segs[2]):
        rt = api.type(group, version, segs[2])
        if not rt.namespaced:
            raise ApiError(404, "NotFound", f"{rt.describe()} is cluster-scoped: drop /namespaces/{segs[1]}")
        rest = segs[3:]
        if len(rest) > 2:
            raise ApiError(404, "NotFound", NOT_FOUND)
        name, sub = (rest + ["", ""])[:2]
        return Target(rt, segs[1], name, sub, watch)
    if not segs:
        raise ApiError(404, "NotFound", NOT_FOUND)
    rt = api.type(group, version, segs[0])
    rest = segs[1:]
    if len(rest) > 2:
        raise ApiError(404, "NotFound", NOT_FOUND)
    name, sub = (rest + ["", ""])[:2]
    if rt.namespaced and name:
        raise ApiError(404, "NotFound", f"{rt.describe()} is namespaced: use /namespaces/<ns>/{rt.plural}/{name}")
    return Target(rt, None, name, sub, watch)


def _table(rt: ResourceType, items: list[dict[str, Any]], rv: str, request: web.Request) -> dict[str, Any]:
    include = request.query.get("includeObject", "Metadata")
    return tables.table(rt, items, rv, include, [dict(c) for c in rt.printer_columns])


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; a 400 naming the parse error otherwise."""
    raw = await request.read()
    if not raw:
        return None
    if request.content_type in ("application/vnd.kubernetes.protobuf", "application/cbor"):
        # kubectl's typed clients try protobuf first and fall back to JSON on 415
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media types include: "
                       f"application/json, application/yaml (not {request.content_type})")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON ({exc}): send a JSON object") from exc


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON body as kube-apiserver writes it (Go's json.Encoder): compact, then a newline. Clients show it
    as is: ``kubernetes.utils.create_from_yaml``'s FailToCreateError prints the Status body it was sent."""
    body = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)




async def _collection(api: Api, request: web.Request, t: Target) -> web.StreamResponse:
    q = request.query
    if request.method == "GET":
        selector = Selector.parse(q.get("labelSelector"), q.get("fieldSelector"), t.rt.kind)
        if t.watch or listoptions.flag(q, "watch"):
            return await watch_http.serve_watch(api, request, t.rt, t.namespace, selector)
        listoptions.check_list(q)
        listing = api.list(t.rt, t.namespace, selector, copy=False)
        limit = q.get("limit")
        if limit is not None and not limit.lstrip("-").isdigit():
            raise bad_request(f"limit={limit!r} must be an integer")
        listing = paging.page(listing, int(limit) if limit else None, q.get("continue"))
        if tables.wants_table(request.headers.get("Accept", "")):
            printed = _table(t.rt, listing["items"], listing["metadata"]["resourceVersion"], request)
            printed["metadata"].update({k: v for k, v in listing["metadata"].items() if k != "resourceVersion"})
            return json_response(printed)
        return json_response(listing)
    if request.method == "POST":
        body = await read_json(request)
        if q.get("dryRun") == "All":
            raise bad_request("dryRun is not emulated by the sandbox: send the request without it")
        return json_response(api.create(t.rt, body, t.namespace or ""), 201)
    if request.method == "DELETE":
        selector = Selector.parse(q.get("labelSelector"), q.get("fieldSelector"), t.rt.kind)
        for item in api.list(t.rt, t.namespace, selector)["items"]:
            meta = item["metadata"]
            try:
                api.delete(t.rt, meta.get("namespace", ""), meta["name"])
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
    raise method_not_allowed(f"{request.method} is not supported on a collection of {t.rt.describe()}")


def _delete_options(request: web.Request, body: Any) -> tuple[int | None, str | None, dict[str, Any] | None]:
    opts = body if isinstance(body, dict) else {}
    grace = opts.get("gracePeriodSeconds", request.query.get("gracePeriodSeconds"))
    propagation = opts.get("propagationPolicy", request.query.get("propagationPolicy"))
    if propagation is None and opts.get("orphanDependents") is not None:
        propagation = "Orphan" if opts["orphanDependents"] else "Background"
    try:
        grace_value = int(grace) if grace is not None else None
    except ValueError as exc:
        raise bad_request(f"gracePeriodSeconds={grace!r} is not an integer number of seconds") from exc
    return grace_value, propagation, opts.get("preconditions")


async def _object(api: Api, request: web.Request, t: Target) -> web.StreamResponse:
    ns, method = t.namespace or "", request.method
    if t.subresource in ("attach", "exec") and t.rt.key == ("", "pods"):
        return await pod_attach_or_exec(api, request, ns, t.name, t.subresource)
    if t.subresource == "portforward" and t.rt.key == ("", "pods"):
        return await pod_port_forward(api, request, ns, t.name)
    if t.subresource == "log" and t.rt.key == ("", "pods") and method == "GET":
        return await pod_log(api, request, ns, t.name)
    if t.subresource == "binding" and t.rt.key == ("", "pods") and method == "POST":
        return json_response(pod_binding(api, ns, t.name, await read_json(request)), 201)
    if t.subresource == "eviction" and t.rt.key == ("", "pods") and method == "POST":
        return json_response(eviction.evict(api, ns, t.name, await read_json(request)), 201)
    if t.subresource and t.subresource not in t.rt.subresources:
        raise ApiError(404, "NotFound", NOT_FOUND)  # also what a typo in a namespaced resource name meets
    if method == "GET":
        obj = api.get(t.rt, ns, t.name)
        if not t.subresource and tables.wants_table(request.headers.get("Accept", "")):
            return json_response(_table(t.rt, [obj], obj["metadata"]["resourceVersion"], request))
        return json_response(obj)
    if method == "PUT":
        return json_response(api.replace(t.rt, ns, t.name, await read_json(request), t.subresource))
    if method == "PATCH":
        body = await read_json(request)
        return json_response(api.patch(t.rt, ns, t.name, body, request.content_type, t.subresource))
    if method == "DELETE" and not t.subresource:
        grace, propagation, pre = _delete_options(request, await read_json(request))
        return json_response(api.delete(t.rt, ns, t.name, grace, propagation, pre))
    raise method_not_allowed(f"{method} is not supported on {t.rt.describe()}/{t.subresource or t.name}")


def resource_handler(api: Api, core: bool) -> Any:
    """The aiohttp handler for ``/api/v1/{tail}`` (core) or ``/apis/{group}/{version}/{tail}``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        info = request.match_info
        group, version = ("", "v1") if core else (info["group"], info["version"])
        segs = [s for s in info["tail"].split("/") if s]
        t = parse_target(api, group, version, segs)
        writes = request.method in ("POST", "PUT", "PATCH")
        with fieldvalidation.request_scope(request.query.get("fieldValidation") if writes else None,
                                           api.field_validation) as scope:
            response = await (_object(api, request, t) if t.name else _collection(api, request, t))
        for warning in scope.headers():
            response.headers.add("Warning", warning)
        return response

    return handle
