"""The client of this package's API calls: list and watch the inventory's kinds (through ``watching``, the
one watch request), and make a namespace offloaded.

Everything comes back as plain dicts exactly as the server sent them (``_preload_content=False``), which is
what the pure functions in ``inventory`` take, and is cheaper than the client's model objects.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
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
from .retrying import Backoff, retry
from .specs import merge_offloading, namespace_offloading
from .trust import TrustPolicy, apply_policy, policy_from_env
from .watching import READ_MARGIN, Collection, Event, ListResult, WatchStream

# Finished pods hold no GPU; the server filters them, so a watch reports a pod leaving as DELETED.
_POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
# Waits re-watch in short pieces: a server only notices a client that left when its watch times out.
WAIT_CHUNK_SECONDS = 5
# A concurrent writer of the NamespaceOffloading: read again at once, then a little later (client-go's
# retry.RetryOnConflict also tries a few times, quickly).
CONFLICT_RETRY = Backoff(first=0.05, cap=0.5, attempts=3)


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


def kubeconfig_namespace(kubeconfig: str | None) -> str | None:
    """The namespace kubectl uses with this kubeconfig (``KUBECONFIG``'s value, a ``:``-separated list;
    None: ``~/.kube/config``): the current context's, else ``default``. None without a usable kubeconfig."""
    try:
        _, current = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig or "~/.kube/config")
    except (kubernetes.config.ConfigException, OSError, ValueError):
        return None
    if not current:
        return None
    return str((current.get("context") or {}).get("namespace") or "default")


class LiqoClient:
    """Lists and watches ForeignClusters, VirtualNodes, virtual Nodes and unfinished Pods."""

    def __init__(self, api_client: ApiClient, request_timeout: float | None = None,
                 trust: TrustPolicy | None = None) -> None:
        self.api_client = api_client
        self.trust = policy_from_env(os.environ) if trust is None else trust
        """Which clusters the origin trusts (None: ``GPU_OFFLOAD_TRUSTED_CLUSTERS``); applied to every inventory."""
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.request_timeout = request_timeout
        """Seconds per list or read request (None: the client's default, no limit)."""

    def collection(self, kind: str) -> Collection:
        """The list call for ``kind`` (cluster-wide; virtual Nodes and unfinished Pods only)."""
        gvk = {"ForeignCluster": L.FOREIGN_CLUSTER, "VirtualNode": L.VIRTUAL_NODE}.get(kind)
        if gvk is not None:
            return Collection(f"{kind}s (cluster-wide)", self.custom.list_cluster_custom_object,
                              {"group": gvk.group, "version": gvk.version, "plural": gvk.plural})
        if kind == "Node":
            return Collection("Nodes (cluster-wide)", self.core.list_node,
                              {"label_selector": f"{L.TYPE_LABEL}={L.TYPE_VIRTUAL_NODE}"})
        if kind == "Pod":
            return Collection("Pods (cluster-wide)", self.core.list_pod_for_all_namespaces,
                              {"field_selector": _POD_SELECTOR})
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")

    def list(self, kind: str) -> ListResult:
        """One list request for ``kind`` (cluster-wide)."""
        return self.collection(kind).list(self.request_timeout)

    def watch(self, kind: str, resource_version: str, timeout_seconds: int, stream: WatchStream) -> Iterator[Event]:
        """Raw watch events (``type``, ``object`` as dicts) from ``resource_version`` for one server timeout.

        ``stream`` lets the caller ``stop()`` it from another thread. Errors (410 Gone included) are raised
        as ``errors.APIError`` subclasses.
        """
        return self.collection(kind).watch(resource_version, timeout_seconds, stream)

    def read_inventory(self) -> Inventory:
        """The inventory from four list requests (the cache avoids them per cell)."""
        items = {kind: self.list(kind).items for kind in KINDS}
        inventory = build_inventory(items["ForeignCluster"], items["VirtualNode"], items["Node"], items["Pod"])
        return apply_policy(inventory, self.trust)

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

        def write() -> dict[str, Any]:
            current = self.read_offloading(namespace)
            if current is None:
                if not create:
                    raise OffloadingMissing(
                        f"namespace {namespace} is not offloaded (no NamespaceOffloading "
                        f"'{L.NAMESPACE_OFFLOADING_NAME}'), so pods there cannot reach a virtual node; in a hub "
                        "deployment the hub creates it when your server starts (ask your JupyterHub admin), "
                        "otherwise create it with `liqoctl offload namespace` or a kubeconfig allowed to"
                    )
                return dict(self._offloading_call("create", namespace, namespace_offloading(namespace, cluster_ids)))
            merged = merge_offloading(current, cluster_ids, node_labels)
            if merged is None:
                return current
            return dict(self._offloading_call("replace", namespace, L.NAMESPACE_OFFLOADING_NAME, merged))

        try:  # someone else created or changed it meanwhile: start again from their version
            current = retry(write, CONFLICT_RETRY, lambda exc: isinstance(exc, APIConflict))
        except APIConflict:
            raise OffloadingNotReady(
                f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME} changed under us three times in a "
                "row; retry in a moment"
            ) from None
        return self.wait_offloading(namespace, cluster_ids, timeout, current)

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
            stream = WatchStream(f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME}")
            for event in stream.events(
                self.custom.list_namespaced_custom_object, g.group, g.version, namespace, g.plural,
                field_selector=f"metadata.name={L.NAMESPACE_OFFLOADING_NAME}", resource_version=version,
                timeout_seconds=max(1, int(min(left, WAIT_CHUNK_SECONDS))), _request_timeout=left + READ_MARGIN,
            ):
                if event["type"] == "DELETED":
                    stream.stop()
                    raise OffloadingNotReady(
                        f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME} was deleted while "
                        "waiting for it (the namespace owner stopped offloading?); create it again or ask them"
                    )
                if event["type"] == "BOOKMARK":
                    continue
                current = event["object"]
                version = str(current.get("metadata", {}).get("resourceVersion") or version)
                state = offloading_state(current, cluster_ids)
                if state.ready or state.failed:
                    stream.stop()
                    break
        if not state.ready:
            raise OffloadingNotReady(describe_not_ready(namespace, state, timeout))
        return current
