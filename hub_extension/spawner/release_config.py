"""Reading the Helm release's gpu-offload ConfigMap with the hub's account (the I/O of ``chart_hub``)."""

from __future__ import annotations

from typing import Any

from gpu_offload.liqo_peering.errors import GpuOffloadError
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

CONFIG_KEY = "config.yaml"


def read_config_map(api_client: Any, namespace: str, name: str, role: str) -> str:
    """``config.yaml`` of the release's ConfigMap ``namespace/name``, which ``role`` lets the hub read."""
    where = f"ConfigMap {namespace}/{name}"
    try:
        found = CoreV1Api(api_client).read_namespaced_config_map(name, namespace)
    except ApiException as exc:
        raise GpuOffloadError(
            f"the hub cannot read {where} (HTTP {exc.status} {exc.reason}): it is the gpu-offload chart's, bound "
            f"for reading to the hub's account by the Role {role}; install or upgrade the "
            "chart, and check that the hub runs as jupyterhub.hub.serviceAccount"
        ) from exc
    text = (found.data or {}).get(CONFIG_KEY)
    if not text:
        raise GpuOffloadError(f"{where} has no {CONFIG_KEY}; upgrade the gpu-offload chart to rewrite it")
    return str(text)
