"""A watch-fed inventory cache that lives as long as the kernel: no list request per cell.

One daemon thread per kind lists once, then watches from the list's resourceVersion, resuming from the last
event or bookmark after each server timeout, and lists again only when the server answers 410 Gone. The
event-applying logic (``apply_event``) is pure and tested on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .client import new_watcher
from .errors import APIError, APIGone, GpuOffloadError
from .inventory import KINDS, Inventory, build_inventory

WATCH_SECONDS = 240
"""Server-side watch timeout: how long one watch request stays open before we resume with a new one."""


class Source(Protocol):
    """What the cache needs from a client: ``client.LiqoClient`` is one."""

    def list(self, kind: str) -> Any:
        """A ``ListResult`` (``items``, ``resource_version``)."""
        ...

    def watch(self, kind: str, resource_version: str, timeout_seconds: int, watcher: Any = None) -> Iterator[dict[str, Any]]:
        """Raw watch events from ``resource_version``."""
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
        code = int(obj.get("code") or 0)
        cls = APIGone if code == 410 else APIError
        raise cls("watching", "the inventory", code, str(obj.get("message") or obj.get("reason") or obj))
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
    relists: int = 0


class InventoryCache:
    """Keeps the inventory's four kinds current through watches; ``inventory()`` reads it without I/O."""

    def __init__(self, source: Source, watch_seconds: int = WATCH_SECONDS, max_backoff: float = 30.0) -> None:
        self._source = source
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self._lock = threading.Condition()
        self._states = {kind: _KindState() for kind in KINDS}
        self._stop = threading.Event()
        self._watchers: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self._generation = 0
        self._snapshot: tuple[int, Inventory] | None = None

    def start(self) -> InventoryCache:
        """Start one daemon thread per kind (daemon: a kernel exiting never waits for a watch)."""
        for kind in KINDS:
            thread = threading.Thread(target=self._run, args=(kind,), name=f"gpu-offload-watch-{kind}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the watches and wait briefly for the threads."""
        self._stop.set()
        for watcher in list(self._watchers.values()):
            watcher.stop()
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self) -> InventoryCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the watch loop ---

    def _relist(self, kind: str) -> str:
        result = self._source.list(kind)
        with self._lock:
            state = self._states[kind]
            state.objects = {object_key(o): o for o in result.items}
            state.resource_version = result.resource_version
            state.synced, state.last_error = True, ""
            state.relists += 1
            self._generation += 1
            self._lock.notify_all()
        return str(result.resource_version)

    def _apply(self, kind: str, event: Mapping[str, Any]) -> None:
        with self._lock:
            state = self._states[kind]
            version = apply_event(state.objects, event)
            if version:
                state.resource_version = version
            if event.get("type") != "BOOKMARK":
                self._generation += 1

    def _run(self, kind: str) -> None:
        first_backoff = min(0.5, self._max_backoff)
        backoff = first_backoff
        while not self._stop.is_set():
            try:
                version = self._states[kind].resource_version or self._relist(kind)
                self._watch_once(kind, version)
                backoff = first_backoff
            except APIGone:
                with self._lock:
                    self._states[kind].resource_version = None  # too old: list again
            except Exception as exc:  # noqa: BLE001 - a watch thread that dies leaves the cache silently stale
                with self._lock:
                    self._states[kind].last_error = str(exc)
                    self._lock.notify_all()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _watch_once(self, kind: str, version: str) -> None:
        watcher = new_watcher()
        self._watchers[kind] = watcher
        for event in self._source.watch(kind, version, self._watch_seconds, watcher):
            if self._stop.is_set():
                watcher.stop()
                return
            self._apply(kind, event)

    # --- readers ---

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every kind has been listed once; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: all(s.synced for s in self._states.values()), timeout)

    def inventory(self, timeout: float = 10.0) -> Inventory:
        """The current inventory, built from the cached objects (rebuilt only after a change)."""
        if not self.wait_synced(timeout):
            with self._lock:
                missing = [f"{k} ({s.last_error or 'no answer yet'})" for k, s in self._states.items() if not s.synced]
            raise GpuOffloadError(
                f"inventory cache not ready after {timeout:g}s: could not list {', '.join(missing)}; check access to "
                "the cluster (gpu-offload clusters shows the error directly)"
            )
        with self._lock:
            if self._snapshot and self._snapshot[0] == self._generation:
                return self._snapshot[1]
            lists = {k: list(s.objects.values()) for k, s in self._states.items()}
            generation = self._generation
        inventory = build_inventory(lists["ForeignCluster"], lists["VirtualNode"], lists["Node"], lists["Pod"])
        with self._lock:
            self._snapshot = (generation, inventory)
        return inventory

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per kind: objects held, resourceVersion, relists so far, last error (for diagnostics and benches)."""
        with self._lock:
            return {
                k: {"objects": len(s.objects), "resource_version": s.resource_version, "relists": s.relists,
                    "last_error": s.last_error}
                for k, s in self._states.items()
            }
