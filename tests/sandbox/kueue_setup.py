"""Shared pieces of the Kueue sandbox tests: a sandbox with Kueue's real CRDs, and Kueue objects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes
from gpu_offload.sandbox.kueue import Kueue, KueueOptions
from gpu_offload.sandbox.testing import RunningSandbox, running_sandbox

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
KUEUE_CRDS = SHARED / "kueue-crds"
LIQO_CRDS = SHARED / "liqo-crds"
G, V = "kueue.x-k8s.io", "v1beta2"
GPU = "nvidia.com/gpu"


@contextmanager
def kueue_sandbox(workdir: Path, crds: bool = True, **options: Any) -> Iterator[RunningSandbox]:
    """The bare API (no scheduler, no kubelet) with Kueue emulated and its CRDs loaded from ../shared
    (``crds=False``: the sandbox's built-in description of the Kueue kinds)."""
    folders = [KUEUE_CRDS] if crds else []
    with running_sandbox(workdir, crds=folders, plugins=[Kueue(KueueOptions(**options)).plugin]) as sb:
        yield sb


def create(custom: kubernetes.client.CustomObjectsApi, plural: str, body: dict[str, Any],
           namespace: str | None = None) -> dict[str, Any]:
    body = {"apiVersion": f"{G}/{V}", **body}
    if namespace:
        return custom.create_namespaced_custom_object(G, V, namespace, plural, body)  # type: ignore[no-any-return]
    return custom.create_cluster_custom_object(G, V, plural, body)  # type: ignore[no-any-return]


def flavor(name: str, node_labels: dict[str, str], tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": node_labels, "tolerations": tolerations or []}}


def cluster_queue(name: str, flavors: dict[str, int], **spec: Any) -> dict[str, Any]:
    return {"kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
        "namespaceSelector": {}, "resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": f, "resources": [{"name": GPU, "nominalQuota": n}]} for f, n in flavors.items()]}], **spec}}


def local_queue(name: str, cq: str) -> dict[str, Any]:
    return {"kind": "LocalQueue", "metadata": {"name": name}, "spec": {"clusterQueue": cq}}


def gpu_pod(name: str, queue: str, gpus: int = 1, priority: str | None = None, **labels: str) -> dict[str, Any]:
    all_labels = {"kueue.x-k8s.io/queue-name": queue, **labels}
    if priority:
        all_labels["kueue.x-k8s.io/priority-class"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": all_labels},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "python:3.12", "command": ["python3", "-c", "import time; time.sleep(600)"],
                "resources": {"limits": {GPU: str(gpus)}}}]}}


def workloads(custom: kubernetes.client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    return custom.list_namespaced_custom_object(G, V, namespace, "workloads")["items"]  # type: ignore[no-any-return]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def admitted(obj: dict[str, Any]) -> bool:
    cond = condition(obj, "Admitted")
    return cond is not None and cond["status"] == "True"


def one_queue_pool(core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi, ns: str,
                   gpus: int = 1) -> None:
    """Namespace ``ns`` with LocalQueue ``q`` on ClusterQueue ``pool`` (one flavor ``gpus``)."""
    core.create_namespace({"metadata": {"name": ns}})
    create(custom, "resourceflavors", flavor("gpus", {"pool": "gpu"}))
    create(custom, "clusterqueues", cluster_queue("pool", {"gpus": gpus}))
    create(custom, "localqueues", local_queue("q", "pool"), ns)


def synced_pool(sandbox: Any, namespace: str, gpu_quota: int | None = None) -> None:
    """The project's `gpu-offload queues sync --namespace NS` against ``sandbox`` (flavors, the ClusterQueue
    gpu-offload, priority classes, NS's LocalQueue); ``gpu_quota`` then lowers the first flavor's GPU quota by
    hand, as an admin might, so the kernel's placement (which looks for a free GPU before launching) still finds
    one while Kueue's quota is full."""
    import pytest

    from gpu_offload.cli import main

    with pytest.MonkeyPatch.context() as env:
        env.setenv("KUBECONFIG", str(sandbox.kubeconfig))
        env.delenv("GPU_OFFLOAD_CONFIG", raising=False)
        assert main(["queues", "sync", "--namespace", namespace]) == 0
    if gpu_quota is None:
        return
    with sandbox.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        queue = custom.get_cluster_custom_object(G, V, "clusterqueues", "gpu-offload")
        for resource in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
            if resource["name"] == GPU:
                resource["nominalQuota"] = gpu_quota
        custom.replace_cluster_custom_object(G, V, "clusterqueues", "gpu-offload", queue)
