"""The watch stream: newline-delimited ``{"type", "object"}`` JSON over a chunked response.

Semantics kept from kube-apiserver 1.35 (the options and their defaults are ``listoptions``'s): a watch with
initial events (``sendInitialEvents=true``, the default from resourceVersion "" or "0") first sends ADDED for
every matching object and, if it allows bookmarks, a BOOKMARK annotated ``k8s.io/initial-events-end`` at that
state's resourceVersion; NotOlderThan a resourceVersion the store has not reached waits for it, then 504s. A
resourceVersion resumes after it (410 Gone once forgotten: the Status is sent as an ERROR event, as a real server
does for an established watch), ``timeoutSeconds`` ends the stream cleanly, and an object that stops (starts)
matching the selector is sent as DELETED (ADDED).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import listoptions, tables
from .api import Api
from .errors import ApiError
from .resources import ResourceType
from .selectors import Selector
from .store import Subscription, WatchEvent

IDLE_CHECK_SECONDS = 2.0


def client_gone(request: web.Request) -> bool:
    """Whether the client of a long-running response closed its connection."""
    return request.transport is None or request.transport.is_closing()


async def _send(resp: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


async def _fresh(api: Api, rv: int) -> None:
    """Wait, as kube-apiserver's watch cache does for a watch with initial events NotOlderThan ``rv``, until the
    store has reached ``rv``; a 504 (sent as an ERROR event) after FRESH_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + listoptions.FRESH_SECONDS
    sub = api.store.subscribe(None)
    try:
        while api.store.resource_version < rv:
            left = deadline - loop.time()
            if left <= 0:
                raise listoptions.too_large(rv, api.store.resource_version)
            await sub.next(timeout=left)
    finally:
        sub.close()


async def _start(api: Api, rt: ResourceType, namespace: str | None, selector: Selector,
                 opts: listoptions.WatchOptions) -> tuple[Subscription, list[dict[str, Any]] | None, int]:
    """The subscription, the objects to send first as ADDED (None: a watch without initial events) and the
    resourceVersion after which events are new to the client."""
    since = opts.since
    if opts.send_initial_events:
        if since is not None:
            await _fresh(api, since)
        sub = api.watch(rt, namespace, None)  # subscribed before listing: nothing falls between the two
        listed = api.list(rt, namespace, selector, copy=False)
        return sub, listed["items"], int(listed["metadata"]["resourceVersion"])
    if since is None:  # sendInitialEvents=false from "" or "0": changes from now on
        since = api.store.resource_version
    return api.watch(rt, namespace, since), None, since


async def serve_watch(api: Api, request: web.Request, rt: ResourceType, namespace: str | None,
                      selector: Selector) -> web.StreamResponse:
    """Stream events of ``rt`` until ``timeoutSeconds`` pass or the client goes away.

    A client that asked for Tables (``kubectl get -w``) gets each object as a one-row Table.
    """
    q = request.query
    opts = listoptions.watch_options(q)
    as_table = tables.wants_table(request.headers.get("Accept", ""))

    async def send(kind: str, obj: dict[str, Any]) -> None:
        if as_table:
            obj = tables.table(rt, [obj], obj["metadata"]["resourceVersion"], q.get("includeObject", "Metadata"),
                               [dict(c) for c in rt.printer_columns])
        await _send(resp, kind, obj)

    async def bookmark(rv: int, annotations: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if annotations:
            meta["annotations"] = annotations
        await _send(resp, "BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})

    timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else 1800.0
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    try:
        sub, initial, after_rv = await _start(api, rt, namespace, selector, opts)
    except ApiError as exc:
        # past the request's checks, a real server answers 200 and sends the Status as an ERROR event
        if exc.code not in (410, 504):
            raise
        await resp.prepare(request)
        await _send(resp, "ERROR", exc.status())
        return resp
    await resp.prepare(request)
    seen = _Membership(resumed=initial is None)
    try:
        for obj in initial or []:
            seen.matching.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
            await send("ADDED", obj)
        if initial is not None and opts.bookmarks:
            # the end of the initial events: what kubectl wait and client-go's informers wait for
            await bookmark(after_rv, {listoptions.INITIAL_EVENTS_END: "true"})

        async def deliver(event: WatchEvent) -> None:
            kind = seen.translate(event.type, event.object, selector, event.previous)
            if kind:
                await send(kind, dict(event.object, apiVersion=rt.api_version))

        await _follow(request, sub, timeout, after_rv, deliver, bookmark if opts.bookmarks else None)
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
