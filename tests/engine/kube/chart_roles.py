"""The chart as Helm renders it, and an API client holding exactly the rights its roles give a user's server.

On the real cluster the API server authorizes each request with RBAC, so a test that runs a kernel with
:func:`user_server_client` proves the chart's user-server role (bound in the user's namespace only, as the
spawner hook binds it) is enough for what the kernel does, and no more than the test checks. The sandbox
authorizes nothing; its tests use the admin's client.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes
import yaml

from .conftest import SHARED

REPO = Path(__file__).resolve().parents[3]
RBAC = "rbac.authorization.k8s.io"


def rendered_chart(folder: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object of the chart with ``values`` (zero-to-jupyterhub from ../shared in its charts/, as
    `helm dependency update` leaves it)."""
    placed = folder / "gpu-offload"
    if not placed.is_dir():
        shutil.copytree(REPO / "helm" / "gpu-offload", placed, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
        shutil.copytree(SHARED / "z2jh-chart" / "jupyterhub", placed / "charts" / "jupyterhub")
    with helm.Chart.load(placed) as chart:
        manifests = chart.render(values=values, is_install=True, name="gpu-offload", namespace="jhub")
    return [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def _role(objects: list[dict[str, Any]], name: str, renamed: str) -> dict[str, Any]:
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == name]
    return {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": renamed}, "rules": role["rules"]}


@contextlib.contextmanager
def user_server_client(admin: Any, namespace: str, objects: list[dict[str, Any]]) -> Iterator[Any]:
    """A client of a ServiceAccount of ``namespace`` holding the chart's ``gpu-offload-user-server`` role through a
    RoleBinding in that namespace and its queue viewer (the one ClusterQueue) cluster-wide, as the chart and the
    spawner hook grant them; the roles are copies under names of this test's own, removed afterwards."""
    core, rbac = kubernetes.client.CoreV1Api(admin), kubernetes.client.RbacAuthorizationV1Api(admin)
    tag = uuid.uuid4().hex[:6]
    server, viewer = _role(objects, "gpu-offload-user-server", f"test-user-server-{tag}"), _role(
        objects, "gpu-offload-queue-viewer", f"test-queue-viewer-{tag}")
    account = {"kind": "ServiceAccount", "name": "gpu-offload-user-server", "namespace": namespace}
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account["name"]}})
    rbac.create_cluster_role(server)
    rbac.create_cluster_role(viewer)
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "gpu-offload-user-server"}, "subjects": [account],
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": server["metadata"]["name"]}})
    rbac.create_cluster_role_binding({
        "metadata": {"name": viewer["metadata"]["name"]}, "subjects": [account],
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": viewer["metadata"]["name"]}})
    try:
        token = core.create_namespaced_service_account_token(
            account["name"], namespace, {"spec": {"expirationSeconds": 3600}}).status.token
        config = kubernetes.client.Configuration()
        config.host = admin.configuration.host
        config.ssl_ca_cert = admin.configuration.ssl_ca_cert
        config.api_key = {"authorization": f"Bearer {token}"}
        with kubernetes.client.ApiClient(config) as client:
            yield client
    finally:
        rbac.delete_cluster_role_binding(viewer["metadata"]["name"])
        rbac.delete_cluster_role(viewer["metadata"]["name"])
        rbac.delete_cluster_role(server["metadata"]["name"])
