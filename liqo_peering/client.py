"""The one module of this package that talks to the Kubernetes API: list and watch the inventory's kinds.

Everything comes back as plain dicts exactly as the server sent them (``_preload_content=False``), which is
what the pure functions in ``inventory`` take, and is cheaper than the client's model objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from . import labels as L
from .errors import GpuOffloadError, api_error
from .inventory import KINDS, Inventory, build_inventory

# Finished pods hold no GPU; the server filters them, so a watch reports a pod leaving as DELETED.
_POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


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
        return kubernetes.config.new_client_from_config(context=context)
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

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)

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
            response = func(**kwargs, _preload_content=False)
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
        stream = watcher.stream(
            func, **kwargs, resource_version=resource_version, timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
        )
        try:
            yield from stream
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "watching", f"{kind}s from resourceVersion {resource_version}") from exc

    def read_inventory(self) -> Inventory:
        """The inventory from four list requests (the cache avoids them per cell)."""
        items = {kind: self.list(kind).items for kind in KINDS}
        return build_inventory(items["ForeignCluster"], items["VirtualNode"], items["Node"], items["Pod"])
