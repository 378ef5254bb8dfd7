"""The object store: objects by (storage key, namespace, name), one resourceVersion counter, watch events.

Extension point (part 2) — how controllers see changes. ``Store.subscribe(key, namespace, since)`` returns
a :class:`Subscription`, an async iterator of :class:`WatchEvent`, bound to the running asyncio loop.
Controllers are asyncio tasks on the server's loop (see ``server.py``); the store's own calls are
synchronous, non-blocking and guarded by one re-entrant lock, so a test thread may call them too.

Objects handed out by ``get``/``list`` are copies the caller may change. ``WatchEvent.object`` is the stored
snapshot itself, shared by all subscribers: treat it as read-only (copy before changing).

History: the last ``history_size`` events are kept; a watch resumed from an older resourceVersion gets 410
Gone, as after an etcd compaction. ``compact()`` drops the history on purpose (tests use it).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .errors import gone

StorageKey = tuple[str, str]  # (group, plural)
Obj = dict[str, Any]


def clone(value: Any) -> Any:
    """Deep copy of JSON-shaped data; several times faster than ``copy.deepcopy`` for API objects."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


@dataclass(frozen=True)
class WatchEvent:
    """One change: ADDED, MODIFIED or DELETED, with the object as stored after the change."""

    type: str
    key: StorageKey
    object: Obj
    resource_version: int
    previous: Obj | None = None
    """The object before a MODIFIED change: a watch with a selector compares both, as kube-apiserver does."""


class Subscription:
    """Events for one storage key (and optionally one namespace), delivered on one asyncio loop."""

    def __init__(self, store: Store, key: StorageKey | None, namespace: str | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self.key = key
        self.namespace = namespace
        self._loop = loop
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self.closed = False

    def wants(self, event: WatchEvent) -> bool:
        """Whether this subscription covers ``event``."""
        if self.key is not None and event.key != self.key:
            return False
        ns = event.object.get("metadata", {}).get("namespace")
        return self.namespace is None or ns == self.namespace

    def _deliver(self, event: WatchEvent | None) -> None:
        # called from any thread: hand over to the subscriber's loop, in order
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def close(self) -> None:
        """Stop receiving events; a pending ``next`` returns None."""
        if not self.closed:
            self.closed = True
            self._store._unsubscribe(self)
            self._deliver(None)

    async def next(self, timeout: float | None = None) -> WatchEvent | None:
        """The next event, or None when closed or when ``timeout`` seconds pass without one."""
        if timeout is None:
            return await self._queue.get()
        # Not asyncio.wait_for: before Python 3.12 it can swallow a cancellation that arrives together
        # with an event, and then server.stop() waits out its join timeout.
        getter = asyncio.ensure_future(self._queue.get())
        try:
            done, _ = await asyncio.wait({getter}, timeout=timeout)
        finally:
            if not getter.done():
                getter.cancel()
        return getter.result() if getter in done else None

    async def next_of(self, keys: Collection[StorageKey], timeout: float | None = None) -> WatchEvent | None:
        """The next event of one of ``keys`` (others are skipped), or None when closed or when ``timeout``
        seconds pass without any event: how a controller waits for what concerns it between two passes."""
        while True:
            event = await self.next(timeout)
            if event is None or event.key in keys:
                return event

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next()
        if event is None:
            raise StopAsyncIteration
        return event


class Store:
    """Thread-safe storage with a global resourceVersion, event history and subscriptions."""

    def __init__(self, history_size: int = 20_000) -> None:
        self.lock = threading.RLock()
        self._rv = 0
        self._objects: dict[StorageKey, dict[tuple[str, str], Obj]] = {}
        self._history: collections.deque[WatchEvent] = collections.deque(maxlen=history_size)
        self._compacted_rv = 0
        self._subs: list[Subscription] = []

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self.lock:
            return self._rv

    def get(self, key: StorageKey, namespace: str, name: str) -> Obj | None:
        """A copy of the object, or None."""
        with self.lock:
            obj = self._objects.get(key, {}).get((namespace, name))
            return clone(obj) if obj is not None else None

    def list(self, key: StorageKey, namespace: str | None = None) -> tuple[builtins.list[Obj], int]:
        """Copies of all objects of ``key`` (in ``namespace`` if given), and the list's resourceVersion."""
        items, rv = self.snapshots(key, namespace)
        return [clone(o) for o in items], rv

    def snapshots(self, key: StorageKey, namespace: str | None = None) -> tuple[builtins.list[Obj], int]:
        """Like ``list`` but the stored objects themselves: read-only, for filtering before copying."""
        with self.lock:
            objs = self._objects.get(key, {})
            items = [o for (ns, _), o in sorted(objs.items()) if namespace is None or ns == namespace]
            return items, self._rv

    def put(self, key: StorageKey, obj: Obj, event_type: str) -> Obj:
        """Store ``obj`` (ADDED or MODIFIED) under a new resourceVersion; returns a copy as stored."""
        with self.lock:
            self._rv += 1
            stored = clone(obj)
            stored["metadata"]["resourceVersion"] = str(self._rv)
            meta = stored["metadata"]
            bucket = self._objects.setdefault(key, {})
            at = (meta.get("namespace", ""), meta["name"])
            previous = bucket.get(at)  # stored objects are replaced, never changed in place
            bucket[at] = stored
            self._emit(WatchEvent(event_type, key, stored, self._rv, previous))
            return clone(stored)

    def remove(self, key: StorageKey, namespace: str, name: str) -> Obj | None:
        """Remove the object (a DELETED event under a new resourceVersion); returns it or None."""
        with self.lock:
            old = self._objects.get(key, {}).pop((namespace, name), None)
            if old is None:
                return None
            self._rv += 1
            gone_obj = clone(old)
            gone_obj["metadata"]["resourceVersion"] = str(self._rv)
            self._emit(WatchEvent("DELETED", key, gone_obj, self._rv))
            return clone(gone_obj)

    @property
    def subscription_count(self) -> int:
        """How many subscriptions are open (a watch whose client left must not stay among them)."""
        with self.lock:
            return len(self._subs)

    def storage_keys(self) -> builtins.list[StorageKey]:
        """Storage keys holding at least one object."""
        with self.lock:
            return [k for k, v in self._objects.items() if v]

    def _emit(self, event: WatchEvent) -> None:
        self._history.append(event)
        for sub in list(self._subs):
            if sub.wants(event):
                sub._deliver(event)

    def compact(self) -> None:
        """Forget the event history, as an etcd compaction does: older watches resume with 410."""
        with self.lock:
            self._history.clear()
            self._compacted_rv = self._rv

    def subscribe(self, key: StorageKey | None, namespace: str | None = None, since: int | None = None,
                  loop: asyncio.AbstractEventLoop | None = None) -> Subscription:
        """Events after resourceVersion ``since`` (None: from now on) for ``key`` (None: all keys).

        Raises a 410 ApiError if events after ``since`` were already forgotten.
        """
        loop = loop or asyncio.get_running_loop()
        with self.lock:
            sub = Subscription(self, key, namespace, loop)
            if since is not None and since < self._rv:
                oldest = self._history[0].resource_version if self._history else self._rv + 1
                if since < max(oldest - 1, self._compacted_rv):
                    raise gone(f"too old resource version: {since} ({max(oldest - 1, self._compacted_rv)})")
                for event in self._history:
                    if event.resource_version > since and sub.wants(event):
                        sub._deliver(event)
            self._subs.append(sub)
            return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self.lock:
            if sub in self._subs:
                self._subs.remove(sub)
