"""Kueue's visibility API (an aggregated API server, pkg/visibility): the pending Workloads of a
LocalQueue or ClusterQueue, head first, with ``positionInClusterQueue`` and ``positionInLocalQueue``
(from 0), ``limit`` (default 1000) and ``offset`` query parameters. Served under v1beta2 and v1beta1,
as Kueue does. Not emulated: the LocalQueue/ClusterQueue summary objects and discovery of the group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..apiserver.api import Api
from ..apiserver.errors import ApiError, bad_request
from . import names
from .scheduler import Entry

DEFAULT_LIMIT = 1000


def _page(request: web.Request) -> tuple[int, int]:
    try:
        limit = int(request.query.get("limit", DEFAULT_LIMIT))
        offset = int(request.query.get("offset", 0))
    except ValueError as exc:
        raise bad_request(f"limit and offset must be integers ({exc})") from exc
    if limit <= 0 or offset < 0:
        raise bad_request("limit must be > 0 and offset >= 0")
    return limit, offset


def _live(api: Api, entries: list[Entry]) -> list[Entry]:
    """The queue of the last pass without Workloads deleted since (Kueue's queues drop them on the event)."""
    rt = api.kind(names.API_VERSION, "Workload")
    return [e for e in entries if api.find(rt, e.namespace, e.name) is not None]


def _item(api: Api, entry: Entry, in_cq: int, in_lq: int) -> dict[str, Any]:
    wl = api.find(api.kind(names.API_VERSION, "Workload"), entry.namespace, entry.name) or {"metadata": {}}
    # what Kueue's newPendingWorkload copies: name, namespace, creation time, owners (4 fields each)
    meta = {k: wl["metadata"][k] for k in ("name", "namespace", "creationTimestamp") if k in wl["metadata"]}
    meta["ownerReferences"] = [{k: ref[k] for k in ("apiVersion", "kind", "name", "uid") if k in ref}
                               for ref in wl["metadata"].get("ownerReferences") or []]
    return {"metadata": meta, "priority": entry.priority, "localQueueName": entry.queue,
            "positionInClusterQueue": in_cq, "positionInLocalQueue": in_lq}


def _summary(version: str, items: list[dict[str, Any]]) -> web.Response:
    body = {"kind": "PendingWorkloadsSummary", "apiVersion": f"{names.VISIBILITY_GROUP}/{version}",
            "metadata": {"creationTimestamp": None}, "items": items}
    return web.json_response(body)


UNAVAILABLE = "service unavailable\n"
"""What the API server's aggregator answers (503, plain text) while Kueue's visibility server is down."""


def routes(app: web.Application, api: Api, queue_order: Callable[[str], list[Entry] | None],
           down: Callable[[], bool] = lambda: False) -> None:
    """Serve the pending-workloads endpoints from ``queue_order(cluster_queue)``; 503 while ``down()``."""
    base = f"/apis/{names.VISIBILITY_GROUP}/{{version}}"

    def check_version(request: web.Request) -> str:
        if down():
            raise web.HTTPServiceUnavailable(text=UNAVAILABLE)
        version = request.match_info["version"]
        if version not in names.VISIBILITY_VERSIONS:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        return version

    async def local_queue(request: web.Request) -> web.Response:
        version = check_version(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        lq = api.find(api.kind(names.API_VERSION, "LocalQueue"), namespace, name)
        entries = queue_order(str(((lq or {}).get("spec") or {}).get("clusterQueue", ""))) if lq else None
        if entries is None:
            raise ApiError(404, "NotFound", f'localqueue.visibility.kueue.x-k8s.io "{name}" not found', name,
                           names.VISIBILITY_GROUP, "localqueue")
        limit, offset = _page(request)
        mine = [(i, e) for i, e in enumerate(_live(api, entries)) if e.namespace == namespace and e.queue == name]
        items = [_item(api, e, in_cq, offset + n) for n, (in_cq, e) in enumerate(mine[offset:offset + limit])]
        return _summary(version, items)

    async def cluster_queue(request: web.Request) -> web.Response:
        version = check_version(request)
        name = request.match_info["name"]
        entries = queue_order(name)
        if entries is None:
            raise ApiError(404, "NotFound", f'clusterqueue.visibility.kueue.x-k8s.io "{name}" not found', name,
                           names.VISIBILITY_GROUP, "clusterqueue")
        limit, offset = _page(request)
        seen: dict[str, int] = {}
        items = []
        for index, entry in enumerate(_live(api, entries)):
            key = f"{entry.namespace}/{entry.queue}"
            in_lq = seen.get(key, 0)
            seen[key] = in_lq + 1
            if offset <= index < offset + limit:
                items.append(_item(api, entry, index, in_lq))
        return _summary(version, items)

    app.router.add_get(base + "/namespaces/{namespace}/localqueues/{name}/pendingworkloads", local_queue)
    app.router.add_get(base + "/clusterqueues/{name}/pendingworkloads", cluster_queue)
