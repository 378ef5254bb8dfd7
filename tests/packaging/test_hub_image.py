"""The hub image built here loads the hub configuration z2jh renders with the project's overlay, mounted
where z2jh's hub Deployment mounts it, and finds the gpu-offload service, the spawner hooks and the
profile list."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_offload.images import manifest

from .conftest import REPO, podman

SPEC = manifest().role("hub")[0]
Z2JH_CHART = REPO / ".." / "shared" / "z2jh-chart" / "jupyterhub"
ETC = "/usr/local/etc/jupyterhub"
# Loads the configuration as the hub does at start-up (JupyterHub's own loader), and reports what it set.
LOAD = r"""
import json
from jupyterhub.app import JupyterHub
app = JupyterHub()
app.load_config_file("/usr/local/etc/jupyterhub/jupyterhub_config.py")
c = app.config
spawner = c.KubeSpawner
def where(f):
    return f"{f.__module__}.{f.__qualname__}" if callable(f) else repr(f)
service = next(s for s in c.JupyterHub.services if s["name"] == "gpu-offload")
import importlib
importlib.import_module(service["command"][-1])  # the service's module is installed
print(json.dumps({"service": service["command"], "service_env": sorted(service.get("environment", {})),
                  "pre_spawn_hook": where(spawner.pre_spawn_hook), "profile_list": where(spawner.profile_list),
                  "spawner": str(c.JupyterHub.spawner_class)}))
"""


def _rendered_hub_files(tmp: Path) -> tuple[Path, Path]:
    """z2jh's hub ConfigMap and Secret, rendered by Helm with the overlay, written as their volumes hold them."""
    import helm_python as helm

    values = yaml.safe_load((REPO / "helm" / "z2jh-overlay.yaml").read_text())
    with helm.Chart.load(Z2JH_CHART.resolve()) as chart:
        manifests = chart.render(values=values, is_install=True, name="jupyterhub", namespace="jhub")
    objects = [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
               for doc in yaml.safe_load_all(text) if doc]
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "hub")
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "hub")
    config, secrets = tmp / "config", tmp / "secret"
    for folder, data in ((config, config_map["data"]), (secrets, {
            k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()} | dict(
            secret.get("stringData") or {}))):
        folder.mkdir()
        folder.chmod(0o755)
        for key, text in data.items():
            (folder / key).write_text(text)
            (folder / key).chmod(0o644)
    return config, secrets


def test_the_hub_image_loads_the_rendered_configuration_with_the_service_hooks_and_profiles(
        built: None, tmp_path: Path) -> None:
    config, secrets = _rendered_hub_files(tmp_path)
    mounts = [f"--volume={config / 'jupyterhub_config.py'}:{ETC}/jupyterhub_config.py:ro",
              f"--volume={config / 'z2jh.py'}:{ETC}/z2jh.py:ro",
              f"--volume={config}:{ETC}/config:ro", f"--volume={secrets}:{ETC}/secret:ro"]
    # the variables Kubernetes and z2jh's Deployment give the hub container
    env = {"POD_NAMESPACE": "jhub", "HELM_RELEASE_NAME": "jupyterhub", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
           "KUBERNETES_SERVICE_PORT": "443", "HUB_SERVICE_HOST": "10.0.0.2", "HUB_SERVICE_PORT": "8081",
           "PROXY_API_SERVICE_HOST": "10.0.0.3", "PROXY_API_SERVICE_PORT": "8001",
           "PROXY_PUBLIC_SERVICE_HOST": "10.0.0.4", "PROXY_PUBLIC_SERVICE_PORT": "80"}
    done = podman("run", "--rm", "--network", "none", *mounts, *[f"--env={k}={v}" for k, v in env.items()],
                  "--workdir=/tmp", SPEC.image, "python3", "-c", LOAD, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["service"] == ["python3", "-m", "gpu_offload.hub_extension.service"]
    assert "GPU_OFFLOAD_CONFIG" in found["service_env"]
    assert found["pre_spawn_hook"] == "gpu_offload.hub_extension.spawner.pre_spawn_hook"
    assert found["profile_list"] == "gpu_offload.hub_extension.spawner.profile_list"
    assert "kubespawner" in found["spawner"].lower()


@pytest.mark.parametrize("module", ["gpu_offload.hub_extension.service", "kubespawner", "jupyterhub"])
def test_the_hub_image_holds_the_hub_extra(built: None, module: str) -> None:
    done = podman("run", "--rm", "--network", "none", SPEC.image, "python3", "-c", f"import {module}", check=False)
    assert done.returncode == 0, done.stderr
