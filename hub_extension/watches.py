"""Watch-fed copies of the two collections the inventory cache does not keep: ResourceSlices and runner pods.

liqo_peering's ``InventoryCache`` holds ForeignClusters, VirtualNodes, virtual Nodes and unfinished pods;
the admin pages also need the granted ResourceSlices, and the usage recorder needs runner pods in every
phase (a finished pod leaves the inventory's pod watch, but its end is exactly what gets metered). Same
pattern as the cache (list once, watch from the list's resourceVersion, list again on 410), reusing its
pure ``apply_event``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
import urllib3
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.cache import apply_event
from gpu_offload.liqo_peering.errors import APIGone, api_error
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

Obj = Mapping[str, Any]
OnEvent = Callable[[str, Obj], None]


class CollectionWatch:
    """One cluster-wide collection kept current by a daemon thread; ``objects()`` reads it without I/O."""

    def __init__(self, what: str, list_func: Callable[..., Any], kwargs: Mapping[str, Any],
                 on_event: OnEvent | None = None, watch_seconds: int = 240) -> None:
        self.what = what
        self._list = list_func
        self._kwargs = dict(kwargs)
        self._on_event = on_event
        self._watch_seconds = watch_seconds
        self._objects: dict[str, Obj] = {}
        self._version: str | None = None
        self._lock = threading.Condition()
        self._synced = False
        self.last_error = ""
        self._stop = threading.Event()
        self._watcher: Any = None
        self._thread = threading.Thread(target=self._run, name=f"gpu-offload-hub-{what}", daemon=True)

    def start(self) -> CollectionWatch:
        """Start the watch thread."""
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching and wait briefly for the thread."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.stop()
        self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the first list arrived."""
        with self._lock:
            return self._lock.wait_for(lambda: self._synced, timeout)

    def objects(self) -> list[Obj]:
        """A snapshot of the objects held."""
        with self._lock:
            return list(self._objects.values())

    def _relist(self) -> str:
        try:
            body = json.loads(self._list(**self._kwargs, _preload_content=False).data)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "listing", self.what) from exc
        items = body.get("items") or []
        with self._lock:
            self._objects = {_key(o): o for o in items}
            self._version = str((body.get("metadata") or {}).get("resourceVersion") or "")
            self._synced, self.last_error = True, ""
            self._lock.notify_all()
        if self._on_event:
            for item in items:  # a restart re-lists: the recorder sees finished pods again (idempotent)
                self._on_event("ADDED", item)
        return self._version

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._watch_once(self._version or self._relist())
                backoff = 0.5
            except APIGone:
                self._version = None
            except Exception as exc:  # noqa: BLE001 - a dead watch thread would leave the pages silently stale
                self.last_error = str(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch_once(self, version: str) -> None:
        self._watcher = kubernetes.watch.Watch()
        stream = self._watcher.stream(
            self._list, **self._kwargs, resource_version=version, timeout_seconds=self._watch_seconds,
            allow_watch_bookmarks=True, deserialize=False,
        )
        try:
            for event in stream:
                if self._stop.is_set():
                    return
                with self._lock:
                    new_version = apply_event(self._objects, event)
                    if new_version:
                        self._version = new_version
                if self._on_event and event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(str(event["type"]), event.get("object") or {})
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "watching", self.what) from exc


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def resource_slices(api_client: ApiClient) -> CollectionWatch:
    """All Liqo ResourceSlices (granted status included)."""
    g = L.RESOURCE_SLICE
    return CollectionWatch("ResourceSlices (cluster-wide)", CustomObjectsApi(api_client).list_cluster_custom_object,
                           {"group": g.group, "version": g.version, "plural": g.plural})


def runner_pods(api_client: ApiClient, on_event: OnEvent | None = None) -> CollectionWatch:
    """Every pod the project created (all phases), in every namespace."""
    return CollectionWatch("runner pods (cluster-wide)", CoreV1Api(api_client).list_pod_for_all_namespaces,
                           {"label_selector": f"{L.MANAGED_BY}={L.MANAGED_BY_VALUE}"}, on_event)


def release_meter(core: CoreV1Api, pod: Obj) -> None:
    """Remove the meter's finalizer from a recorded pod, so its deletion completes.

    A JSON patch that first tests the entry is still where it was read: another writer's change makes it
    fail (422) and the next event of the pod tries again. A pod already gone is fine.
    """
    meta = pod.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if L.METERED_FINALIZER not in finalizers:
        return
    at = f"/metadata/finalizers/{finalizers.index(L.METERED_FINALIZER)}"
    try:
        core.patch_namespaced_pod(str(meta.get("name")), str(meta.get("namespace")), [
            {"op": "test", "path": at, "value": L.METERED_FINALIZER}, {"op": "remove", "path": at}])
    except ApiException as exc:
        if exc.status not in (404, 409, 422):
            raise api_error(exc, "releasing", f"Pod {meta.get('namespace')}/{meta.get('name')}") from exc
