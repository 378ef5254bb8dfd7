"""Images through the official client: registry-prefixed notebook and hub images run with their console
scripts on PATH, PyTorch images run a stock Python with torch, and a missing package fails the pull."""

from __future__ import annotations

from pathlib import Path

import jupyterhub
import pytest
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kubelet.images import ImageError, Images

# the sandbox level's shared origin (tests/sandbox/conftest.py) finds npm's tools here for hub images
NODE_BIN = Path(__file__).resolve().parents[3] / ".ci" / "node" / "node_modules" / ".bin"
core, namespace = fixtures.core, fixtures.namespace


def _run(core, namespace: str, name: str, image: str, command: list[str]) -> tuple[str, str]:
    core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [
        {"name": "main", "image": image, "command": command}]}})
    pod = wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase in ("Succeeded", "Failed")
                     and p, f"{name} to finish", timeout=120)
    return pod.status.phase, core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()


def test_registry_prefixed_singleuser_image_runs_jupyterhub_singleuser(core, namespace):
    phase, log = _run(core, namespace, "user", "quay.io/jupyterhub/singleuser:5.2",
                      ["jupyterhub-singleuser", "--version"])
    assert (phase, log.strip()) == ("Succeeded", jupyterhub.__version__)


@pytest.mark.skipif(not (NODE_BIN / "configurable-http-proxy").exists(),
                    reason="configurable-http-proxy missing: tests/run.sh installs it into .ci/node")
def test_hub_image_carries_jupyterhub_and_the_proxy(core, namespace):
    phase, log = _run(core, namespace, "hub", "quay.io/jupyterhub/k8s-hub:4.0.0",
                      ["sh", "-c", "jupyterhub --version && configurable-http-proxy --version"])
    assert phase == "Succeeded", log
    assert log.splitlines()[0] == jupyterhub.__version__ and log.splitlines()[1][0].isdigit()


def test_pytorch_image_runs_torch_without_the_project(core, namespace):
    pytest.importorskip("torch")
    code = ("import torch, importlib.util; print(torch.arange(4.0).sum().item(), "
            "importlib.util.find_spec('gpu_offload') is None)")
    phase, log = _run(core, namespace, "torch", "docker.io/pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
                      ["python", "-c", code])
    assert (phase, log) == ("Succeeded", "6.0 True\n")


def test_an_image_whose_package_is_missing_fails_to_pull_naming_it(tmp_path):
    images = Images(tmp_path, stock_packages=("surely-not-an-installed-package",))
    with pytest.raises(ImageError, match=r'Failed to pull image "python:3.12": .*surely-not-an-installed-package.*'
                                         r"pip install"):
        images.resolve("python:3.12")
    assert not (tmp_path / "images" / "stock" / "venv").exists()  # nothing half-made
