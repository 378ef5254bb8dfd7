"""The only module of ``gpu_offload.flows`` that talks to an API server: it reads what placement needs.

A small adapter: ``gpu_offload.liqo_peering`` builds the inventory from API objects (pure), this reads
those objects with the official client. It also refuses a target namespace that Liqo does not offload,
since a pod there would stay Pending (OffloadingBackOff) instead of reaching a virtual node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import GpuOffloadFlowError

if TYPE_CHECKING:
    from gpu_offload.liqo_peering.inventory import Inventory

TIMEOUT_SECONDS = 5


class ClusterUnreachable(GpuOffloadFlowError):
    """The API server did not answer (connection refused, DNS, timeout)."""


def _client(where: str) -> Any:
    from kubernetes import client, config

    if where == "<in-cluster>":
        config.load_incluster_config()
        return client.ApiClient()
    configuration = client.Configuration()
    config.load_kube_config(config_file=where, client_configuration=configuration)
    # Validation must not hang on a cluster that is off: no urllib3 retries, a short timeout per call.
    configuration.retries = 0
    return client.ApiClient(configuration)


def _items(api: Any, response: Any) -> list[dict[str, Any]]:
    data = response if isinstance(response, dict) else api.sanitize_for_serialization(response)
    return list(data.get("items") or [])


def read_inventory(where: str, namespace: str | None) -> Inventory:
    """ForeignClusters, VirtualNodes, virtual Nodes and running Pods, as ``liqo_peering`` wants them."""
    import urllib3
    from gpu_offload.liqo_peering import labels as L
    from gpu_offload.liqo_peering.inventory import build_inventory
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = _client(where)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    t = TIMEOUT_SECONDS
    try:
        fcs = custom.list_cluster_custom_object(*_gvp(L.FOREIGN_CLUSTER), _request_timeout=t)
        vns = custom.list_cluster_custom_object(*_gvp(L.VIRTUAL_NODE), _request_timeout=t)
        nodes = core.list_node(label_selector=f"{L.TYPE_LABEL}={L.TYPE_VIRTUAL_NODE}", _request_timeout=t)
        pods = core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed", _request_timeout=t
        )
        if namespace:
            _require_offloaded(custom, namespace)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterUnreachable(
            f"the cluster in {where} does not answer ({exc.__class__.__name__}); start it, or set "
            "METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE=config to place from configuration"
        ) from exc
    except ApiException as exc:
        raise GpuOffloadFlowError(
            f"reading Liqo objects through {where} failed: HTTP {exc.status} {exc.reason}; check that Liqo is "
            "installed and that your account may list foreignclusters, virtualnodes, nodes and pods"
        ) from exc
    return build_inventory(_items(api, fcs), _items(api, vns), _items(api, nodes), _items(api, pods))


def _gvp(gvk: Any) -> tuple[str, str, str]:
    return gvk.group, gvk.version, gvk.plural


def _require_offloaded(custom: Any, namespace: str) -> None:
    from gpu_offload.liqo_peering import labels as L
    from kubernetes.client.exceptions import ApiException

    gvk = L.NAMESPACE_OFFLOADING
    try:
        custom.get_namespaced_custom_object(
            gvk.group, gvk.version, namespace, gvk.plural, L.NAMESPACE_OFFLOADING_NAME, _request_timeout=TIMEOUT_SECONDS
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        raise GpuOffloadFlowError(
            f"namespace {namespace!r} is not offloaded by Liqo (no NamespaceOffloading named "
            f"'{L.NAMESPACE_OFFLOADING_NAME}' in it), so step pods there would stay Pending; offload it "
            f"(liqoctl offload namespace {namespace}) or set METAFLOW_GPU_OFFLOAD_NAMESPACE to one that is"
        ) from exc
