"""Watch-fed copies of the two collections the inventory cache does not keep: ResourceSlices and metered pods.

liqo_peering's ``InventoryCache`` holds ForeignClusters, VirtualNodes, virtual Nodes and unfinished pods;
the admin pages also need the granted ResourceSlices, and the usage recorder needs the pods on virtual nodes
(and the project's own) in every phase (a finished pod leaves the inventory's pod watch, but its end is exactly what gets metered). Both are
kept by liqo_peering's ``ListWatch`` (the same loop as the cache) and its pure ``apply_event``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.cache import apply_event, object_key
from gpu_offload.liqo_peering.errors import APIConflict, APIInvalid, APINotFound, api_error
from gpu_offload.liqo_peering.watching import Collection, Event, ListResult, ListWatch
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

Obj = Mapping[str, Any]
OnEvent = Callable[[str, Obj], None]


class CollectionWatch:
    """One cluster-wide collection kept current by a daemon thread; ``objects()`` reads it without I/O."""

    def __init__(self, collection: Collection, on_event: OnEvent | None = None,
                 keep: Callable[[Obj], bool] | None = None) -> None:
        self.what = collection.what
        self._on_event = on_event
        self._keep = keep
        """Which listed objects to hold (None: all); one held stays until it is deleted."""
        self._objects: dict[str, Obj] = {}
        self._lock = threading.Condition()
        self._synced = False
        self.last_error = ""
        self._loop = ListWatch(collection.what, collection.list, collection.watch, self)

    def start(self) -> CollectionWatch:
        """Start the watch thread."""
        self._loop.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching and wait briefly for the thread."""
        self._loop.close(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the first list arrived."""
        with self._lock:
            return self._lock.wait_for(lambda: self._synced, timeout)

    def objects(self) -> list[Obj]:
        """A snapshot of the objects held."""
        with self._lock:
            return list(self._objects.values())

    # --- watching.Sink, called from the watch thread ---

    def listed(self, result: ListResult) -> None:
        items = [o for o in result.items if self._keep is None or self._keep(o)]
        with self._lock:
            self._objects = {object_key(o): o for o in items}
            self._synced, self.last_error = True, ""
            self._lock.notify_all()
        if self._on_event:
            for item in items:  # a restart re-lists: the recorder sees finished pods again (idempotent)
                self._on_event("ADDED", item)

    def event(self, event: Event) -> None:
        obj = event.get("object") or {}
        if self._keep is not None and event.get("type") in ("ADDED", "MODIFIED", "DELETED") and not self._keep(obj):
            with self._lock:
                if object_key(obj) not in self._objects:
                    return  # never held: not this watch's
        with self._lock:
            apply_event(self._objects, event)
        if self._on_event and event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
            self._on_event(str(event["type"]), event.get("object") or {})

    def failed(self, exc: Exception) -> None:
        self.last_error = str(exc)


def resource_slices(api_client: ApiClient) -> CollectionWatch:
    """All Liqo ResourceSlices (granted status included)."""
    g = L.RESOURCE_SLICE
    return CollectionWatch(Collection("ResourceSlices (cluster-wide)", CustomObjectsApi(api_client).list_cluster_custom_object,
                                      {"group": g.group, "version": g.version, "plural": g.plural}))


def kueue_objects(api_client: ApiClient, g: L.GVK) -> CollectionWatch:
    """Every object of one Kueue kind, cluster-wide (Workloads in every namespace): the Queues page's source."""
    return CollectionWatch(Collection(f"{g.kind}s (cluster-wide)", CustomObjectsApi(api_client).list_cluster_custom_object,
                                      {"group": g.group, "version": g.version, "plural": g.plural}))


QUEUE_PAGE_KINDS = (L.CLUSTER_QUEUE, L.RESOURCE_FLAVOR, L.WORKLOAD_PRIORITY_CLASS, L.WORKLOAD)
"""What the Queues page watches when queueing is on (the chart grants list and watch on them)."""


def metered_pods(api_client: ApiClient, keep: Callable[[Obj], bool], on_event: OnEvent | None = None) -> CollectionWatch:
    """The pods ``keep`` selects (all phases) among every pod of every namespace: no label selector, since
    whoever creates a pod writes its labels, and a pod without the project's would hold GPUs unmetered."""
    return CollectionWatch(Collection("pods (cluster-wide)", CoreV1Api(api_client).list_pod_for_all_namespaces, {}),
                           on_event, keep)


def release_meter(api_client: ApiClient, pod: Obj) -> None:
    """Remove the meter's finalizer from a recorded pod, so its deletion completes.

    A JSON patch that first tests the entry is still where it was read: another writer's change makes it
    fail (422) and the next event of the pod tries again. A pod already gone is fine.
    """
    meta = pod.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if L.METERED_FINALIZER not in finalizers:
        return
    at = f"/metadata/finalizers/{finalizers.index(L.METERED_FINALIZER)}"
    where = f"Pod {meta.get('namespace')}/{meta.get('name')}"
    try:
        CoreV1Api(api_client).patch_namespaced_pod(str(meta.get("name")), str(meta.get("namespace")), [
            {"op": "test", "path": at, "value": L.METERED_FINALIZER}, {"op": "remove", "path": at}])
    except ApiException as exc:
        error = api_error(exc, "releasing", where)
        # gone already, or changed since it was read (409, 422 from the test op): the pod's next event retries
        if not isinstance(error, (APINotFound, APIConflict, APIInvalid)):
            raise error from exc


def read_namespace(api_client: ApiClient, name: str) -> Obj | None:
    """The namespace as the API has it, None once it is gone (the meter reads its owner from it)."""
    try:
        response = CoreV1Api(api_client).read_namespace(name, _preload_content=False)
    except ApiException as exc:
        error = api_error(exc, "reading", f"namespace {name}")
        if isinstance(error, APINotFound):
            return None
        raise error from exc
    return json.loads(response.data)  # type: ignore[no-any-return]
