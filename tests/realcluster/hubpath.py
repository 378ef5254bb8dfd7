"""The hub chart on the Liqo pair's origin, for ``test_real_hub_path.py``: installed with the ``helm`` command
(built by ``liqo.sh`` from Helm's Go module) from the umbrella chart with zero-to-jupyterhub from ../shared,
and the hub reached as a user reaches it, through the proxy (by its pod's address: no load balancer here).

Pure builders (values, requests) apart from the few calls that act (helm, HTTP, the kernel's websocket).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..kernel_channels import execute_code
from .liqopair import DONOR_ID, ORIGIN_STATE

LIQO_STATE = Path(os.environ.get("LIQO_STATE", "/var/tmp/gpu-offload-realcluster-liqo"))
HELM = LIQO_STATE / "bin" / "helm"
RELEASE = "gpu-offload"
HUB_NAMESPACE = "jhub"
# The hub database's volume: a PersistentVolume on the origin's node (no provisioner runs here), under the
# origin's state directory, which down.sh removes.
HUB_DB_DIR = ORIGIN_STATE / "hub-db"
# Object storage for the quickstart's large input (its 8 MB array is over what a pod's Secret takes): moto's S3
# server on the origin's bridge address (env.sh: cluster 1's bridge is 10.219.1.1), which the user's server on
# the origin and the runner pods on the donor both reach, as a store outside both clusters is reached.
STORAGE_HOST = "10.219.1.1"
BUCKET = "gpu-offload-e2e"
# The runner image the kernel picks for its Python (3.11), imported into the donor by liqo.sh's hub_images.
RUNNER_IMAGE = "jupyter-gpu-offload/runner:0.1.0-py3.11"
# The user-server image, also the Metaflow steps' image (on the donor too)
USER_IMAGE = "jupyter-gpu-offload/singleuser:0.1.0"


def values(admin_token: str, storage_endpoint: str) -> dict[str, Any]:
    """What an admin of this origin sets (docs/install.md: object storage among it), plus what this machine
    needs: images never pulled,
    time for a loaded node to start a server, no user scheduler or image pre-puller (their images are not built here), no load balancer, no per-user
    volume (no provisioner), and a test service whose token administers the hub's users."""
    never = {"pullPolicy": "Never"}
    return {
        "queueing": {"kueue": {"enabled": True}},
        "offload": {"objectStorage": {"endpoint": storage_endpoint, "bucket": BUCKET}},
        "liqo": {"tenantNamespaces": [f"liqo-tenant-{DONOR_ID}"]},
        "clusters": {DONOR_ID: {"trusted": True, "gpuModel": "fake", "pricePerGpuHour": 2.0}},
        "jupyterhub": {
            "hub": {
                "image": never,
                # JupyterHub waits 30 s (http_timeout) for a started server to answer: a user server took longer
                # at load average 20 here ("alice's server never showed up ... after 30 seconds")
                "config": {"KubeSpawner": {"http_timeout": 600}},
                "services": {"e2e": {"api_token": admin_token}},
                "loadRoles": {"e2e": {"services": ["e2e"], "scopes": [
                    "admin:users", "admin:servers", "tokens", "read:metrics", "custom:gpu-offload:view",
                    "custom:gpu-offload:manage", "access:services"]}},
            },
            "proxy": {"service": {"type": "ClusterIP"}, "chp": {"image": never}},
            # the kernel's S3 credentials, from the usual AWS_* variables (moto accepts any), and the admin's
            # Metaflow settings for flows users run from their server (metaflow_settings)
            "singleuser": {"image": never, "storage": {"type": "none"}, "startTimeout": 600,
                           "extraEnv": {"AWS_ACCESS_KEY_ID": "e2e", "AWS_SECRET_ACCESS_KEY": "e2e",
                                        "AWS_DEFAULT_REGION": "us-east-1", **metaflow_settings(storage_endpoint)}},
            "scheduling": {"userScheduler": {"enabled": False}, "userPlaceholder": {"enabled": False}},
            "prePuller": {"hook": {"enabled": False}, "continuous": {"enabled": False}},
            "cull": {"enabled": False},
        },
    }


def metaflow_settings(storage_endpoint: str) -> dict[str, str]:
    """What an admin gives users' servers so their flows run on the cluster: the datastore in the object store,
    step pods in the user-server image (on the donor: liqo.sh's hub_images), finished step Jobs removed after a
    minute (Metaflow keeps them a week). The namespace, the user and placement from configuration come from the
    spawner (docs/metaflow.md)."""
    return {"METAFLOW_DEFAULT_DATASTORE": "s3", "METAFLOW_DATASTORE_SYSROOT_S3": f"s3://{BUCKET}/metaflow",
            "METAFLOW_S3_ENDPOINT_URL": storage_endpoint, "METAFLOW_DEFAULT_METADATA": "local",
            "METAFLOW_KUBERNETES_CONTAINER_IMAGE": USER_IMAGE,
            "METAFLOW_KUBERNETES_JOB_TTL_SECONDS_AFTER_FINISHED": "60"}


def hub_db_volume() -> dict[str, Any]:
    """The PersistentVolume zero-to-jupyterhub's hub database claim (1Gi, no class) binds to."""
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "gpuorc-hub-db"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": str(HUB_DB_DIR), "type": "Directory"}}}


def helm(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The helm command on the origin; fails the caller with its output."""
    kubeconfig = ORIGIN_STATE / "admin.kubeconfig"
    done = subprocess.run([str(HELM), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def install(chart: Path, values_file: Path, admin_token: str, storage_endpoint: str) -> None:
    values_file.write_text(yaml.safe_dump(values(admin_token, storage_endpoint)))
    helm("install", RELEASE, str(chart), "--namespace", HUB_NAMESPACE, "--create-namespace",
         "--values", str(values_file))


def new_token() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class Hub:
    """The hub through its proxy: ``base`` is http://<proxy pod>:8000/."""

    base: str

    def call(self, method: str, path: str, token: str, body: Any = None, timeout: float = 60) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path.lstrip("/"), method=method, data=data,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            text = reply.read().decode()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def status(self, path: str, token: str) -> int:
        """The HTTP status of a GET (an error status too)."""
        try:
            self.call("GET", path, token)
        except urllib.error.HTTPError as error:
            return error.code
        return 200


def execute(hub: Hub, user: str, kernel: str, token: str, code: str, timeout: float = 600) -> str:
    """Run ``code`` in a kernel of ``user``'s server through the proxy, as the browser does."""
    return execute_code(f"ws{hub.base[4:]}user/{user}/api/kernels/{kernel}/channels", code,
                        headers=[f"Authorization: token {token}"], username=user, timeout=timeout)


def notebook_cells(path: Path) -> list[str]:
    """The code cells of a notebook, in order."""
    notebook = json.loads(path.read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
