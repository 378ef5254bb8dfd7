"""The watch stream: newline-delimited ``{"type", "object"}`` JSON over a chunked response.

Semantics kept from kube-apiserver: no resourceVersion (or "0") first sends ADDED for every matching
object, a resourceVersion resumes after it (410 Gone once forgotten: the Status is sent as an ERROR event,
as a real server does for an established watch), ``timeoutSeconds`` ends the stream cleanly, and an
object that stops (starts) matching the selector is sent as DELETED (ADDED).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import tables
from .api import Api
from .errors import ApiError, bad_request
from .resources import ResourceType
from .selectors import Selector
from .store import Subscription, WatchEvent

IDLE_CHECK_SECONDS = 2.0


def client_gone(request: web.Request) -> bool:
    """Whether the client of a long-running response closed its connection."""
    return request.transport is None or request.transport.is_closing()


def _since(value: str | None) -> int | None:
    if value in (None, "", "0"):
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise bad_request(f"resourceVersion={value!r} is not a resource version this server issued") from exc


async def _send(resp: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


async def serve_watch(api: Api, request: web.Request, rt: ResourceType, namespace: str | None,
                      selector: Selector) -> web.StreamResponse:
    """Stream events of ``rt`` until ``timeoutSeconds`` pass or the client goes away.

    A client that asked for Tables (``kubectl get -w``) gets each object as a one-row Table.
    """
    q = request.query
    as_table = tables.wants_table(request.headers.get("Accept", ""))

    async def send(kind: str, obj: dict[str, Any]) -> None:
        if as_table:
            obj = tables.table(rt, [obj], obj["metadata"]["resourceVersion"], q.get("includeObject", "Metadata"),
                               [dict(c) for c in rt.printer_columns])
        await _send(resp, kind, obj)

    since = _since(q.get("resourceVersion"))
    timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else 1800.0
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    try:
        sub = api.watch(rt, namespace, since)
        listed = api.list(rt, namespace, selector, copy=False) if since is None else None
    except ApiError as exc:
        if exc.code != 410:
            raise
        await resp.prepare(request)
        await _send(resp, "ERROR", exc.status())
        return resp
    await resp.prepare(request)
    seen = _Membership(resumed=since is not None)
    try:
        # events up to the initial list's resourceVersion repeat what the list holds: skip them
        initial = listed["items"] if listed else []
        listed_rv = int(listed["metadata"]["resourceVersion"]) if listed else 0
        for obj in initial:
            seen.matching.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
            await send("ADDED", obj)

        async def deliver(event: WatchEvent) -> None:
            kind = seen.translate(event.type, event.object, selector, event.previous)
            if kind:
                await send(kind, dict(event.object, apiVersion=rt.api_version))

        async def bookmark(rv: int) -> None:
            await _send(resp, "BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                           "metadata": {"resourceVersion": str(rv)}})

        wants_bookmarks = q.get("allowWatchBookmarks") in ("1", "true", "True")
        await _follow(request, sub, timeout, max(listed_rv, since or 0), deliver,
                      bookmark if wants_bookmarks else None)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        sub.close()
    return resp


async def _follow(request: web.Request, sub: Subscription, timeout: float, after_rv: int,
                  deliver: Callable[[WatchEvent], Awaitable[None]],
                  bookmark: Callable[[int], Awaitable[None]] | None) -> None:
    """Pass events newer than ``after_rv`` to ``deliver`` until the timeout, the end of the subscription
    or the client leaving. When idle, ``bookmark(rv)`` (if asked for) tells the client how far it is:
    the resourceVersion of the last event this subscription received, so resuming from it loses nothing."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_rv, marked_rv = after_rv, after_rv
    while True:
        left = deadline - loop.time()
        if left <= 0 or sub.closed or client_gone(request):
            return
        # wake up now and then: a client that went away must not keep a subscription for 30 minutes
        event = await sub.next(timeout=min(left, IDLE_CHECK_SECONDS))
        if event is None:
            if bookmark is not None and last_rv > marked_rv:
                await bookmark(last_rv)
                marked_rv = last_rv
            continue
        if event.resource_version > after_rv:
            last_rv = event.resource_version
            await deliver(event)


class _Membership:
    """Which objects the client currently believes match the selector, to translate event types."""

    def __init__(self, resumed: bool) -> None:
        self.resumed = resumed
        self.matching: set[tuple[str, str]] = set()
        self.unmatched: set[tuple[str, str]] = set()

    def translate(self, kind: str, obj: dict[str, Any], selector: Selector,
                  previous: dict[str, Any] | None = None) -> str:
        """The event type to send for ``kind`` on ``obj`` ("" to send nothing).

        As kube-apiserver's watch cache does: a change is judged on the object before and after it, so an
        object that never matched is never reported, even on a watch resumed from a resourceVersion; a
        deletion is sent when the object as deleted matches.
        """
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        now = selector.matches(obj)
        if kind == "ADDED":
            was = False
        elif previous is not None:
            was = selector.matches(previous)
        elif key in self.matching or key in self.unmatched:
            was = key in self.matching
        else:  # no earlier state known: the client saw it earlier unless it is new
            was = self.resumed
        self.matching.discard(key)
        self.unmatched.discard(key)
        if kind == "DELETED":
            return kind if now else ""
        (self.matching if now else self.unmatched).add(key)
        if now:
            return "MODIFIED" if was else "ADDED"
        return "DELETED" if was else ""
