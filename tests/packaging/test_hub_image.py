"""The hub image built here loads the hub configuration the chart renders (zero-to-jupyterhub's own
jupyterhub_config.py and z2jh.py, the rendered hub ConfigMap and Secret mounted where z2jh's hub Deployment
mounts them, this release's gpu-offload ConfigMap served by the sandbox's API server) with JupyterHub's own
loader, and finds the gpu-offload service, the spawner hooks and the profile list."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_offload.images import manifest

from .conftest import REPO, podman

SPEC = manifest().role("hub")[0]
Z2JH_CHART = (REPO / ".." / "shared" / "z2jh-chart" / "jupyterhub").resolve()
RELEASE, NAMESPACE = "gpu-offload", "jhub"
ETC = "/usr/local/etc/jupyterhub"
# Loads the configuration as the hub does at start-up (JupyterHub's own loader) and reports what it set.
LOAD = r"""
import importlib, json
from jupyterhub.app import JupyterHub
app = JupyterHub()
app.load_config_file("/usr/local/etc/jupyterhub/jupyterhub_config.py")
c = app.config
def where(f):
    return f"{f.__module__}.{f.__qualname__}" if callable(f) else repr(f)
service = next(s for s in c.JupyterHub.services if s["name"] == "gpu-offload")
importlib.import_module(service["command"][-1])  # the service's module is installed in this image
print(json.dumps({"service": service["command"], "service_env": sorted(service.get("environment", {})),
                  "pre_spawn_hook": where(c.KubeSpawner.pre_spawn_hook),
                  "profile_list": where(c.KubeSpawner.profile_list),
                  "user_namespaces": c.KubeSpawner.enable_user_namespaces}))
"""


def _render(tmp: Path) -> list[dict[str, Any]]:
    """The chart with zero-to-jupyterhub from ../shared as its dependency (as `helm dependency update` leaves
    it), rendered by Helm as a new release."""
    import helm_python as helm

    placed = tmp / "chart"
    shutil.copytree(REPO / "helm" / "gpu-offload", placed, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    shutil.copytree(Z2JH_CHART, placed / "charts" / "jupyterhub")
    with helm.Chart.load(placed) as chart:
        manifests = chart.render(values=None, is_install=True, name=RELEASE, namespace=NAMESPACE)
    return [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def _hub_volumes(objects: list[dict[str, Any]], tmp: Path) -> list[str]:
    """z2jh's hub ConfigMap and Secret written out, as ``--volume`` options at the hub Deployment's paths."""
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "z2jh.py" in o.get("data", {}))
    secret = next(o for o in objects if o["kind"] == "Secret" and "values.yaml" in o.get("data", {}))
    config, secrets = tmp / "config", tmp / "secret"
    files = {config: dict(config_map["data"]),
             secrets: {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}}
    for folder, data in files.items():
        folder.mkdir()
        folder.chmod(0o755)
        for key, text in data.items():
            (folder / key).write_text(text)
            (folder / key).chmod(0o644)
    return [f"--volume={config / 'jupyterhub_config.py'}:{ETC}/jupyterhub_config.py:ro",
            f"--volume={config / 'z2jh.py'}:{ETC}/z2jh.py:ro",
            f"--volume={config}:{ETC}/config:ro", f"--volume={secrets}:{ETC}/secret:ro"]


def _service_environment(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The <NAME>_SERVICE_HOST/_PORT variables the kubelet sets for every Service of the namespace (z2jh's
    configuration finds the hub and the proxy by them); the addresses are made up, nothing connects."""
    services = [o for o in objects if o["kind"] == "Service"]
    return {f"{s['metadata']['name'].upper().replace('-', '_')}_SERVICE_{part}": value
            for i, s in enumerate(services)
            for part, value in (("HOST", f"10.96.1.{i + 1}"), ("PORT", str(s["spec"]["ports"][0]["port"])))}


def test_the_hub_image_loads_the_rendered_configuration_with_the_service_hooks_and_profiles(
        built: None, tmp_path: Path) -> None:
    from gpu_offload.hub_extension.spawner.chart_hub import release_fullname
    from gpu_offload.sandbox.testing import running_sandbox
    from kubernetes.client import CoreV1Api

    objects = _render(tmp_path)
    ours = next(o for o in objects if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == f"{release_fullname(RELEASE)}-config")
    with running_sandbox(tmp_path) as sandbox:
        core = CoreV1Api(sandbox.api_client())
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        core.create_namespaced_config_map(NAMESPACE, {**ours, "metadata": {**ours["metadata"],
                                                                            "namespace": NAMESPACE}})
        Path(sandbox.kubeconfig).chmod(0o644)
        env = {"POD_NAMESPACE": NAMESPACE, "KUBECONFIG": "/etc/sandbox/kubeconfig", **_service_environment(objects)}
        done = podman("run", "--rm", "--network", "host", *_hub_volumes(objects, tmp_path),
                      f"--volume={sandbox.kubeconfig}:/etc/sandbox/kubeconfig:ro",
                      *[f"--env={k}={v}" for k, v in env.items()], "--workdir=/tmp", SPEC.image,
                      "python3", "-c", LOAD, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["service"] == ["python3", "-m", "gpu_offload.hub_extension.service.app"]
    assert "GPU_OFFLOAD_CONFIG" in found["service_env"]
    assert found["pre_spawn_hook"] == "gpu_offload.hub_extension.spawner.hooks.pre_spawn_hook"
    assert found["profile_list"] == "gpu_offload.hub_extension.spawner.hooks.profile_list"
    assert found["user_namespaces"] is True


@pytest.mark.parametrize("module", ["gpu_offload.hub_extension.service.app", "kubespawner", "jupyterhub"])
def test_the_hub_image_holds_the_hub_extra(built: None, module: str) -> None:
    done = podman("run", "--rm", "--network", "none", SPEC.image, "python3", "-c", f"import {module}", check=False)
    assert done.returncode == 0, done.stderr


def test_the_hub_image_runs_the_jupyterhub_of_its_z2jh_base(built: None) -> None:
    done = podman("run", "--rm", "--network", "none", SPEC.image, "python3", "-c",
                  "import jupyterhub; print(jupyterhub.__version__)", check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SPEC.jupyterhub
