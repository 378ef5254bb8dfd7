"""``gpu-offload lab --hub``: JupyterHub on 127.0.0.1 with the gpu-offload service (its admin pages) and the
spawner hook, against the embedded SANDBOX.

- Log in as ``admin`` (a hub admin: the service's pages) or as any other name (a user), with the password
  printed at start (JupyterHub's dummy authenticator: for a laptop, never for a shared machine).
- A user's server runs **on this machine** (JupyterHub's local process spawner), prepared by
  ``hub_extension.spawner.local_pre_spawn_hook``: the same offloaded namespace, role bindings and environment
  as in a real hub, but the server reads the sandbox with the hub's kubeconfig instead of its namespace's
  service account. In a real hub, KubeSpawner runs it in a pod; the sandbox cannot run user servers in pods
  yet (it needs console scripts in notebook images, per-pod networks and non-root containers). That is the
  seam: swap the spawner and the hook in :data:`HUB_CONFIG` when it can.
- The hub's own files (database, cookie secret, the service's usage database, users' home folders) live in
  a temporary folder removed at the end.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import yaml

from .embedded import BUCKET, DONORS, IMAGE, Embedded
from .lab import RUNS_EXTENSION, Child, answers, free_port, proxy_command

USER_PREFIX = "gpu-offload-"
"""User namespaces are ``gpu-offload-<user>`` (the admission policy's prefix, the service's config)."""

HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {{"admin"}}
c.JupyterHub.db_url = "sqlite:///{workdir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{workdir}/cookie_secret"
c.JupyterHub.custom_scopes = {{
    "custom:gpu-offload:view": {{"description": "See the GPU offload admin pages."}},
    "custom:gpu-offload:manage": {{"description": "Change GPU lending."}},
}}
c.JupyterHub.services = [{{
    "name": "gpu-offload",
    "url": "http://127.0.0.1:{service_port}",
    "command": [{python!r}, "-m", "gpu_offload.hub_extension.service"],
    "display": True,
    "oauth_no_confirm": True,
    "oauth_client_allowed_scopes": ["custom:gpu-offload:view", "custom:gpu-offload:manage"],
    "environment": {service_env!r},
}}]
# the seam: a local spawner until the sandbox runs user servers in pods (then KubeSpawner + pre_spawn_hook)
from gpu_offload.hub_extension.spawner import local_pre_spawn_hook  # noqa: E402
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{workdir}/home/{{username}}"
c.Spawner.pre_spawn_hook = local_pre_spawn_hook
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = {root!r}
c.Spawner.args = {server_args!r}
c.Spawner.environment = {server_env!r}
c.Spawner.start_timeout = 120
"""


def _service_config(embedded: Embedded, workdir: Path) -> dict[str, object]:
    """The service's and the hook's configuration (the chart's ConfigMap in a real hub)."""
    return {
        "hubNamespace": "gpu-offload",
        "userNamespaces": {"prefix": USER_PREFIX},
        "liqo": {"tenantNamespaces": [d.tenant_namespace for d in DONORS]},
        "usageDatabase": {"url": f"sqlite:///{workdir}/usage.sqlite"},
        "offload": {"defaultImage": IMAGE, "objectStorage": {"endpoint": embedded.s3_endpoint, "bucket": BUCKET}},
        "clusters": {d.cluster_id: {"trusted": True} for d in DONORS},
    }


def responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def jupyterhub(workdir: Path, root: Path, port: int, embedded: Embedded, env: Mapping[str, str]) -> Child:
    """JupyterHub with the service and the (local) spawner hook on ``port``; returns it starting."""
    proxy = proxy_command()
    assert proxy is not None, "checked by lab.missing_requirements"
    (workdir / "home").mkdir()
    config_file = workdir / "gpu-offload.yaml"
    config_file.write_text(yaml.safe_dump(_service_config(embedded, workdir)))
    jupyter_config = workdir / "jupyter-config"
    jupyter_config.mkdir()
    (jupyter_config / "jupyter_server_config.json").write_text(
        f'{{"ServerApp": {{"jpserver_extensions": {{"{RUNS_EXTENSION}": true}}}}}}')
    password = secrets.token_urlsafe(9)
    base = f"http://127.0.0.1:{port}/"
    hub_env = {"KUBECONFIG": str(embedded.kubeconfig), "GPU_OFFLOAD_CONFIG": str(config_file)}
    kernel = embedded.kernel_env()
    server_env = {**{k: v for k, v in kernel.items() if k.startswith(("AWS_", "KUBECONFIG"))},
                  "GPU_OFFLOAD_SERVICE_URL": f"{base}services/gpu-offload/",
                  "JUPYTER_CONFIG_PATH": str(jupyter_config)}
    service_port = free_port()
    text = HUB_CONFIG.format(
        port=port, hub_port=free_port(), proxy_api_port=free_port(), service_port=service_port, proxy=proxy,
        password=password, workdir=workdir, python=sys.executable, service_env=hub_env, root=str(root),
        server_args=["--allow-root"] if os.geteuid() == 0 else [], server_env=server_env)
    (workdir / "jupyterhub_config.py").write_text(text)
    log = (workdir / "jupyterhub.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(workdir / "jupyterhub_config.py")],
                               cwd=workdir, env={**env, **hub_env, "PATH": f"{Path(sys.executable).parent}:"
                                                 f"{Path(proxy).parent}:{env.get('PATH', '')}"},
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def ready() -> bool:
        # the service refuses a request without a token once it is up: any HTTP answer will do
        return answers(f"{base}hub/health") and responds(f"http://127.0.0.1:{service_port}/services/gpu-offload/api/me")

    url = f"{base}hub/login   (user `admin` sees the admin pages; any other name is a user; password {password})"
    return Child(process, url, ready)
