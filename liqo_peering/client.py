"""The one module of this package that talks to the Kubernetes API: list and watch the inventory's kinds.

Everything comes back as plain dicts exactly as the server sent them (``_preload_content=False``), which is
what the pure functions in ``inventory`` take, and is cheaper than the client's model objects.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from . import labels as L
from .errors import (
    APIConflict,
    APINotFound,
    GpuOffloadError,
    OffloadingMissing,
    OffloadingNotReady,
    api_error,
)
from .inventory import KINDS, Inventory, build_inventory
from .offloading import describe_not_ready, offloading_state
from .specs import merge_offloading, namespace_offloading

# Finished pods hold no GPU; the server filters them, so a watch reports a pod leaving as DELETED.
_POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
# Waits re-watch in short pieces: a server only notices a client that left when its watch times out.
WAIT_CHUNK_SECONDS = 5


@dataclass(frozen=True)
class ListResult:
    """A list response: the items and the resourceVersion to watch from."""

    items: tuple[dict[str, Any], ...]
    resource_version: str


def api_client_from_environment(context: str | None = None) -> ApiClient:
    """An ApiClient from the in-cluster service account, else from the kubeconfig (``KUBECONFIG``)."""
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
            configuration = kubernetes.client.Configuration()
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            return ApiClient(configuration)
        # Read KUBECONFIG now: the client's default was frozen when the kubernetes package was imported.
        return kubernetes.config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"), context=context)
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = os.environ.get("KUBECONFIG", "~/.kube/config")
        raise GpuOffloadError(
            f"no usable Kubernetes configuration (kubeconfig {where}, context {context or 'current'}): {exc}; "
            "point KUBECONFIG at a kubeconfig for the origin cluster, or use the local backend"
        ) from exc


def new_watcher() -> Any:
    """A ``kubernetes.watch.Watch`` that yields objects as plain dicts.

    ``return_type="object"`` skips the client's model classes (costly for Pods and Nodes) while keeping its
    handling of ERROR events; ``deserialize=False`` would skip that too (it fails on an ERROR event).
    """
    return kubernetes.watch.Watch(return_type="object")


class LiqoClient:
    """Lists and watches ForeignClusters, VirtualNodes, virtual Nodes and unfinished Pods."""

    def __init__(self, api_client: ApiClient, request_timeout: float | None = None) -> None:
        self.api_client = api_client
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.request_timeout = request_timeout
        """Seconds per list or read request (None: the client's default, no limit)."""

    def _call(self, kind: str) -> tuple[Callable[..., Any], dict[str, Any]]:
        gvk = {"ForeignCluster": L.FOREIGN_CLUSTER, "VirtualNode": L.VIRTUAL_NODE}.get(kind)
        if gvk is not None:
            return self.custom.list_cluster_custom_object, {"group": gvk.group, "version": gvk.version, "plural": gvk.plural}
        if kind == "Node":
            return self.core.list_node, {"label_selector": f"{L.TYPE_LABEL}={L.TYPE_VIRTUAL_NODE}"}
        if kind == "Pod":
            return self.core.list_pod_for_all_namespaces, {"field_selector": _POD_SELECTOR}
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")

    def list(self, kind: str) -> ListResult:
        """One list request for ``kind`` (cluster-wide)."""
        func, kwargs = self._call(kind)
        try:
            response = func(**kwargs, _preload_content=False, _request_timeout=self.request_timeout)
            body = json.loads(response.data)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "listing", f"{kind}s (cluster-wide)") from exc
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return ListResult(tuple(body.get("items") or ()), version)

    def watch(self, kind: str, resource_version: str, timeout_seconds: int, watcher: Any = None) -> Iterator[dict[str, Any]]:
        """Raw watch events (``type``, ``object`` as dicts) from ``resource_version`` for one server timeout.

        ``watcher`` is a ``kubernetes.watch.Watch`` the caller keeps so it can ``stop()`` it from another
        thread. Errors (410 Gone included) are raised as ``errors.APIError`` subclasses.
        """
        func, kwargs = self._call(kind)
        watcher = watcher or new_watcher()
        # The read timeout outlives the server's own timeout: it only catches a connection that went silent.
        stream = watcher.stream(
            func, **kwargs, resource_version=resource_version, timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True, _request_timeout=timeout_seconds + 30,
        )
        try:
            yield from stream
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "watching", f"{kind}s from resourceVersion {resource_version}") from exc

    def read_inventory(self) -> Inventory:
        """The inventory from four list requests (the cache avoids them per cell)."""
        items = {kind: self.list(kind).items for kind in KINDS}
        return build_inventory(items["ForeignCluster"], items["VirtualNode"], items["Node"], items["Pod"])

    # --- namespace offloading ---

    def _offloading_call(self, verb: str, namespace: str, *args: Any, **kwargs: Any) -> Any:
        g = L.NAMESPACE_OFFLOADING
        func = getattr(self.custom, f"{verb}_namespaced_custom_object")
        target = f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME}"
        try:
            return func(g.group, g.version, namespace, g.plural, *args, _request_timeout=self.request_timeout, **kwargs)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, {"get": "reading", "create": "creating", "replace": "updating"}[verb], target) from exc

    def read_offloading(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's NamespaceOffloading, or None when it has none."""
        try:
            return dict(self._offloading_call("get", namespace, L.NAMESPACE_OFFLOADING_NAME))
        except APINotFound:
            return None

    def ensure_offloading(
        self,
        namespace: str,
        cluster_ids: Sequence[str],
        create: bool = True,
        timeout: float = 60.0,
        node_labels: dict[str, dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        """Make pods of ``namespace`` able to reach ``cluster_ids``, then wait until Liqo says they can.

        Creates the NamespaceOffloading when absent (if ``create``), or widens its clusterSelector without
        dropping anyone's clusters; a concurrent writer (409) makes it read again and retry. Returns the
        object once ready; raises ``OffloadingMissing`` (absent and not ours to create) or
        ``OffloadingNotReady`` naming the phase.
        """
        for _attempt in range(3):
            current = self.read_offloading(namespace)
            try:
                if current is None:
                    if not create:
                        raise OffloadingMissing(
                            f"namespace {namespace} is not offloaded (no NamespaceOffloading "
                            f"'{L.NAMESPACE_OFFLOADING_NAME}'), so pods there cannot reach a virtual node; in a hub "
                            "deployment the hub creates it when your server starts (ask your JupyterHub admin), "
                            "otherwise create it with `liqoctl offload namespace` or a kubeconfig allowed to"
                        )
                    current = self._offloading_call("create", namespace, namespace_offloading(namespace, cluster_ids))
                else:
                    merged = merge_offloading(current, cluster_ids, node_labels)
                    if merged is not None:
                        current = self._offloading_call("replace", namespace, L.NAMESPACE_OFFLOADING_NAME, merged)
                break
            except APIConflict:
                continue  # someone else created or changed it meanwhile: start from their version
        else:
            raise OffloadingNotReady(
                f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME} changed under us three times in a "
                "row; retry in a moment"
            )
        return self.wait_offloading(namespace, cluster_ids, timeout, dict(current))

    def wait_offloading(
        self, namespace: str, cluster_ids: Sequence[str], timeout: float, current: dict[str, Any]
    ) -> dict[str, Any]:
        """Watch the NamespaceOffloading until it is ready for ``cluster_ids``; raise naming the phase."""
        deadline = time.monotonic() + timeout
        state = offloading_state(current, cluster_ids)
        version = str(current.get("metadata", {}).get("resourceVersion") or "")
        g = L.NAMESPACE_OFFLOADING
        while not state.ready and not state.failed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            watcher = new_watcher()
            try:
                for event in watcher.stream(
                    self.custom.list_namespaced_custom_object, g.group, g.version, namespace, g.plural,
                    field_selector=f"metadata.name={L.NAMESPACE_OFFLOADING_NAME}", resource_version=version,
                    timeout_seconds=max(1, int(min(left, WAIT_CHUNK_SECONDS))), _request_timeout=left + 30,
                ):
                    if event["type"] == "DELETED":
                        watcher.stop()
                        raise OffloadingNotReady(
                            f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME} was deleted while "
                            "waiting for it (the namespace owner stopped offloading?); create it again or ask them"
                        )
                    current = event["raw_object"]
                    version = str(current.get("metadata", {}).get("resourceVersion") or version)
                    state = offloading_state(current, cluster_ids)
                    if state.ready or state.failed:
                        watcher.stop()
                        break
            except (ApiException, urllib3.exceptions.HTTPError) as exc:
                raise api_error(exc, "watching", f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME}") from exc
        if not state.ready:
            raise OffloadingNotReady(describe_not_ready(namespace, state, timeout))
        return current
