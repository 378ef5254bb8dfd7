"""A watch-fed inventory cache that lives as long as the kernel: no list request per cell.

One ``watching.ListWatch`` per kind (list once, watch, resume, list again on 410 Gone, back off after
failures). The event-applying logic (``apply_event``) is pure and tested on its own.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import APIError, GpuOffloadError
from .inventory import KINDS, Inventory, build_inventory
from .retrying import WATCH_BACKOFF, Backoff
from .trust import TrustPolicy, apply_policy
from .watching import WATCH_SECONDS, Event, ListResult, ListWatch, WatchStream, event_error


class Source(Protocol):
    """What the cache needs from a client: ``client.LiqoClient`` is one."""

    def list(self, kind: str) -> ListResult:
        """One list request for ``kind``."""
        ...

    def watch(self, kind: str, resource_version: str, timeout_seconds: int, stream: WatchStream) -> Iterator[Event]:
        """Raw watch events from ``resource_version`` through ``stream``."""
        ...


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta['name']}" if meta.get("namespace") else str(meta["name"])


def apply_event(objects: MutableMapping[str, Mapping[str, Any]], event: Mapping[str, Any]) -> str | None:
    """Apply one raw watch event to ``objects`` in place; return the resourceVersion to resume from.

    BOOKMARK events only move the resourceVersion. An ERROR event is raised: ``APIGone`` for 410 (the
    caller lists again), another ``APIError`` otherwise.
    """
    kind = event.get("type")
    obj = event.get("object") or {}
    if kind == "ERROR":
        raise event_error(event, "the inventory")
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if kind in ("ADDED", "MODIFIED"):
        objects[object_key(obj)] = obj
    elif kind == "DELETED":
        objects.pop(object_key(obj), None)
    elif kind != "BOOKMARK":
        raise ValueError(f"watch event of unknown type {kind!r}; expected ADDED, MODIFIED, DELETED, BOOKMARK or ERROR")
    return str(version) if version else None


@dataclass
class _KindState:
    objects: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    resource_version: str | None = None
    synced: bool = False
    last_error: str = ""
    refused: bool = False
    """The last list was refused (401/403): retrying will not help until someone grants the rights."""
    relists: int = 0


class _KindSink:
    """Delivers one kind's list and events into the cache (``watching.Sink``)."""

    def __init__(self, cache: InventoryCache, kind: str) -> None:
        self.cache, self.kind = cache, kind

    def listed(self, result: ListResult) -> None:
        self.cache._listed(self.kind, result)

    def event(self, event: Event) -> None:
        self.cache._apply(self.kind, event)

    def failed(self, exc: Exception) -> None:
        self.cache._failed(self.kind, exc)


class InventoryCache:
    """Keeps the inventory's four kinds current through watches; ``inventory()`` reads it without I/O."""

    def __init__(self, source: Source, watch_seconds: int = WATCH_SECONDS, max_backoff: float = WATCH_BACKOFF.cap) -> None:
        self._lock = threading.Condition()
        # a source without a policy (a test's fake) trusts no donor
        self._trust: TrustPolicy = getattr(source, "trust", None) or TrustPolicy()
        self._states = {kind: _KindState() for kind in KINDS}
        self._generation = 0
        self._snapshot: tuple[int, Inventory] | None = None
        backoff = Backoff(first=min(WATCH_BACKOFF.first, max_backoff), cap=max_backoff)
        self._loops = [
            ListWatch(kind, functools.partial(source.list, kind), functools.partial(source.watch, kind),
                      _KindSink(self, kind), watch_seconds, backoff)
            for kind in KINDS
        ]

    def start(self) -> InventoryCache:
        """Start one watch thread per kind."""
        for loop in self._loops:
            loop.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the watches and wait briefly for the threads."""
        for loop in self._loops:
            loop.close(0)  # stop every watch first, so the waits below overlap
        for loop in self._loops:
            loop.close(timeout)

    def __enter__(self) -> InventoryCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the watches deliver ---

    def _listed(self, kind: str, result: ListResult) -> None:
        with self._lock:
            state = self._states[kind]
            state.objects = {object_key(o): o for o in result.items}
            state.resource_version = result.resource_version
            state.synced, state.last_error, state.refused = True, "", False
            state.relists += 1
            self._generation += 1
            self._lock.notify_all()

    def _apply(self, kind: str, event: Mapping[str, Any]) -> None:
        with self._lock:
            state = self._states[kind]
            version = apply_event(state.objects, event)
            if version:
                state.resource_version = version
            if event.get("type") != "BOOKMARK":
                self._generation += 1
                self._lock.notify_all()

    def _failed(self, kind: str, exc: Exception) -> None:
        with self._lock:
            state = self._states[kind]
            state.last_error = str(exc)
            state.refused = isinstance(exc, APIError) and exc.status in (401, 403)
            self._lock.notify_all()

    # --- readers ---

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every kind has been listed once; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: all(s.synced for s in self._states.values()), timeout)

    def wait_changed(self, seen: int, timeout: float) -> int:
        """Block until the cached objects differ from generation ``seen`` (or ``timeout`` passes); return the
        current generation. A controller passes what it last returned, so it wakes on changes, not on a clock."""
        with self._lock:
            self._lock.wait_for(lambda: self._generation != seen, timeout)
            return self._generation

    @property
    def generation(self) -> int:
        """A number that changes with every list or watch event applied (not with bookmarks). Read it before
        ``inventory()``: what is built then is at least that new, so a value derived from it may be kept under it."""
        with self._lock:
            return self._generation

    def _settled(self) -> bool:
        """Every kind listed, or one refused outright (waiting longer would not change the answer)."""
        states = self._states.values()
        return all(s.synced for s in states) or any(s.refused and not s.synced for s in states)

    def inventory(self, timeout: float = 10.0) -> Inventory:
        """The current inventory, built from the cached objects (rebuilt only after a change). Raises after
        ``timeout`` if a kind was never listed, and at once if a list was refused for want of rights: the
        refusal stays known until a later list succeeds, so a kernel without the rights pays no wait per cell."""
        with self._lock:
            self._lock.wait_for(self._settled, timeout)
            unlisted = {k: s for k, s in self._states.items() if not s.synced}
            missing = [f"{k} ({s.last_error or 'no answer yet'})" for k, s in unlisted.items()]
            refused = any(s.refused for s in unlisted.values())
        if missing:
            when = "refused" if refused else f"not ready after {timeout:g}s"
            raise GpuOffloadError(
                f"inventory cache {when}: could not list {', '.join(missing)}; check access to "
                "the cluster (gpu-offload clusters shows the error directly)"
            )
        with self._lock:
            if self._snapshot and self._snapshot[0] == self._generation:
                return self._snapshot[1]
            lists = {k: list(s.objects.values()) for k, s in self._states.items()}
            generation = self._generation
        inventory = build_inventory(lists["ForeignCluster"], lists["VirtualNode"], lists["Node"], lists["Pod"])
        inventory = apply_policy(inventory, self._trust)
        with self._lock:
            self._snapshot = (generation, inventory)
        return inventory

    def objects(self, kind: str) -> list[Mapping[str, Any]]:
        """A snapshot of the objects held for ``kind`` (one of ``inventory.KINDS``), as the server sent them."""
        with self._lock:
            return list(self._states[kind].objects.values())

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per kind: objects held, resourceVersion, relists so far, last error (for diagnostics and benches)."""
        with self._lock:
            return {
                k: {"objects": len(s.objects), "resource_version": s.resource_version, "relists": s.relists,
                    "last_error": s.last_error}
                for k, s in self._states.items()
            }
