"""``gpu-offload lab --hub``: JupyterHub on 127.0.0.1 with the gpu-offload service (its admin pages), and
KubeSpawner running each user's server in a pod of the embedded SANDBOX, prepared by the project's spawner
hook as the Helm chart's hub does (``helm/gpu-offload``, ``hub_extension/spawner/chart_hub.py``).

- Log in as ``admin`` (a hub admin: the service's pages) or as any other name (a user), with the password
  printed at start (JupyterHub's dummy authenticator: for a laptop, never for a shared machine).
- A user's server is the pod ``jupyter-<user>`` in the namespace ``gpu-offload-<user>``, which
  ``hub_extension.spawner.pre_spawn_hook`` makes offloaded (role bindings, service account, NetworkPolicy,
  NamespaceOffloading) before KubeSpawner creates the pod. The pod runs as uid 1000 under the chart's
  security contexts, off the virtual nodes, as the service account ``gpu-offload-user-server``, and reads
  the API with that account's in-cluster configuration, as on a cluster. Its files live in the pod and go
  with it.
- Pods reach this machine only at the sandbox's host address (``RunningOrigin.host_address``), so the hub's
  API and the service listen there; the browser still uses 127.0.0.1.
- Queueing is on, as with the chart's ``queueing.kueue.enabled``: the sandbox emulates Kueue, the service's queue
  controller writes the ClusterQueue over both donors, and a user's cells wait in line when its GPUs are taken
  (the service's Queues page shows who waits and who holds them).
- The hub's own files (database, cookie secret, the service's usage database) live in a temporary folder
  removed at the end. On Ctrl-C the hub stops the user servers (KubeSpawner deletes their pods); the
  sandbox then stops with whatever is left.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import yaml

from ..hub_extension.service.local_hub import LocalHub, assign, config_text
from ..liqo_peering import environment as E
from ..liqo_peering import labels as L
from .embedded import BUCKET, DONORS, IMAGE, S3_CREDENTIALS, Embedded
from .servers import RUNS_EXTENSION, Child, answers, free_port, proxy_command

HUB_NAMESPACE = "gpu-offload"
USER_PREFIX = f"{HUB_NAMESPACE}-"
"""User namespaces are ``gpu-offload-<user>`` (the admission policy's prefix, the service's config)."""
SERVER_IMAGE = "jupyter-gpu-offload/singleuser:sandbox"
"""The user servers' image; the sandbox runs it with its own interpreter (``jupyterhub-singleuser``,
gpu_offload and JupyterLab), as the chart's singleuser image carries them."""
START_TIMEOUT = 300
"""Seconds a user server gets to start: a loaded laptop takes its time over JupyterLab."""

# As the z2jh overlay: the server stays off the virtual nodes (its namespace is offloaded, so Liqo's webhook
# would let it leave), meets Pod Security's restricted level, and runs as jovyan (uid 1000, group 100).
SPAWNER = {
    "KubeSpawner.enable_user_namespaces": True,
    "KubeSpawner.user_namespace_template": HUB_NAMESPACE + "-{username}",
    "KubeSpawner.user_namespace_labels": {"gpu-offload.io/user-namespace": "true",
                                          "hub.jupyter.org/network-access-hub": "true"},
    "KubeSpawner.extra_labels": {"hub.jupyter.org/network-access-hub": "true"},
    "KubeSpawner.image": SERVER_IMAGE,
    "KubeSpawner.uid": 1000,
    "KubeSpawner.fs_gid": 100,
    "KubeSpawner.pod_security_context": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "KubeSpawner.container_security_context": {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}},
    "KubeSpawner.node_affinity_required": [{"matchExpressions": [
        {"key": L.TYPE_LABEL, "operator": "NotIn", "values": [L.TYPE_VIRTUAL_NODE]}]}],
    "KubeSpawner.cmd": ["jupyterhub-singleuser"],  # z2jh's singleuser.cmd: the sandbox's images have no CMD
    "KubeSpawner.server_token_scopes": ["users:activity!user", "access:servers!server",
                                        "access:services!service=gpu-offload"],
    # pip enables the runs extension in an image (etc/jupyter); an editable install, which the sandbox's
    # image interpreter may be, does not: say it on the command line
    "KubeSpawner.args": [f"--ServerApp.jpserver_extensions={RUNS_EXTENSION}=True"],
    # the notebook images' WORKDIR (the sandbox's images have none): JupyterLab's file browser starts there
    "KubeSpawner.working_dir": "/home/jovyan",
    "KubeSpawner.default_url": "/lab",
    "KubeSpawner.start_timeout": START_TIMEOUT,
    "KubeSpawner.http_timeout": START_TIMEOUT,
    "KubeSpawner.k8s_api_request_timeout": 30,
}


def _service_config(embedded: Embedded, workdir: Path) -> dict[str, object]:
    """The service's and the hook's configuration (the chart's ConfigMap in a real hub)."""
    return {
        "hubNamespace": HUB_NAMESPACE,
        "userNamespaces": {"prefix": USER_PREFIX},
        "liqo": {"tenantNamespaces": [d.tenant_namespace for d in DONORS]},
        "usageDatabase": {"url": f"sqlite:///{workdir}/usage.sqlite"},
        "offload": {"defaultImage": IMAGE, "objectStorage": {"endpoint": embedded.s3_endpoint, "bucket": BUCKET}},
        "clusters": {d.cluster_id: {"trusted": True} for d in DONORS},
        # as the chart's queueing.kueue.enabled: the service keeps Kueue's objects following the donors, the
        # spawner hook gives each user namespace its LocalQueue and each server GPU_OFFLOAD_QUEUE
        "queueing": {"kueue": {"enabled": embedded.queueing}},
    }


def responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def hub_config(hub: LocalHub, password: str) -> str:
    """The lab hub's configuration file: the shared hub lines, the dummy password, KubeSpawner and the hook."""
    server_env = {E.SERVICE_URL.name: hub.service_url, **S3_CREDENTIALS}
    return config_text(hub, [
        assign("DummyAuthenticator.password", password),
        assign("Authenticator.allow_all", True),
        assign("JupyterHub.spawner_class", "kubespawner.KubeSpawner"),
        *(assign(target, value) for target, value in SPAWNER.items()),
        assign("KubeSpawner.environment", server_env),
        "from gpu_offload.hub_extension.spawner.hooks import pre_spawn_hook  # noqa: E402",
        "c.KubeSpawner.pre_spawn_hook = pre_spawn_hook",
    ])


def jupyterhub(workdir: Path, port: int, embedded: Embedded, env: Mapping[str, str]) -> Child:
    """JupyterHub with the service, KubeSpawner and the spawner hook on ``port``; returns it starting."""
    proxy = proxy_command()
    assert proxy is not None, "checked by lab.missing_requirements"
    config_file = workdir / "gpu-offload.yaml"
    config_file.write_text(yaml.safe_dump(_service_config(embedded, workdir)))
    password = secrets.token_urlsafe(9)
    service_env = {"KUBECONFIG": str(embedded.kubeconfig), "GPU_OFFLOAD_CONFIG": str(config_file)}
    hub = LocalHub(workdir, proxy, port, free_port(), free_port(), free_port(), service_env,
                   hub_ip=embedded.host_address, service_ip=embedded.host_address)
    (workdir / "jupyterhub_config.py").write_text(hub_config(hub, password))
    log = (workdir / "jupyterhub.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(workdir / "jupyterhub_config.py")],
                               cwd=workdir, env={**env, **service_env, "PATH": f"{Path(sys.executable).parent}:"
                                                 f"{Path(proxy).parent}:{env.get('PATH', '')}"},
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def ready() -> bool:
        # the service refuses a request without a token once it is up: any HTTP answer will do
        return answers(f"{hub.url}hub/health") and responds(f"{hub.service_url}api/me")

    url = f"{hub.url}hub/login   (user `admin` sees the admin pages; any other name is a user; password {password})"
    return Child(process, url, ready)
