"""`pip install jupyter-gpu-offload` alone, in a fresh venv, is what a kernel needs: the magic runs a cell on
a sandbox started from another venv (this one), and none of the sandbox's dependencies, nor torch, came
with it. pip's cache is this host's, so nothing is downloaded twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from .conftest import REPO

SHARED = REPO / ".." / "shared"
# The sandbox extra (pyproject.toml), torch, and what they bring that nothing else in the base install needs
# (aiohttp is not among them: the kubernetes client requires it too).
NOT_IN_BASE = ("jsonschema", "kubernetes-validate", "nbclient", "nbformat", "numpy", "matplotlib",
               "moto", "torch", "werkzeug", "flask")
INSTALL_TIMEOUT = 1800  # a guard against a hung pip, not a speed claim
DRIVER = r"""
import os
from kubernetes import client, config
config.load_kube_config(os.environ["KUBECONFIG"])
client.CoreV1Api().create_namespace({"metadata": {"name": os.environ["GPU_OFFLOAD_NAMESPACE"]}})
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "gpu_offload.magics")
shell.user_ns["x"] = 20
result = shell.run_cell("%%gpu_offload --gpus 1\nimport sys\nprint('ran in a pod', flush=True)\ny = x + 22")
print("y =", shell.user_ns.get("y"), "error:", result.error_in_exec)
"""


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the package installed from this checkout without extras."""
    where = tmp_path_factory.mktemp("lean") / "venv"
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", str(REPO)], capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A sandbox with two donors, from this venv (it has the sandbox extra); yields its kubeconfig."""
    kubeconfig = tmp_path_factory.mktemp("sandbox") / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "gpu_offload.cli", "sandbox", "--kubeconfig", str(kubeconfig),
                             "--crds", str(SHARED / "liqo-crds"), "--donors", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: kubeconfig.exists() or proc.poll() is not None, "the sandbox's kubeconfig", timeout=120)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        yield kubeconfig
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_base_install_pulls_none_of_the_sandboxs_dependencies(lean: Path) -> None:
    listed = subprocess.run([str(lean), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True).stdout
    installed = {_normalized(line.split("==")[0]) for line in listed.splitlines() if "==" in line}
    assert "jupyter-gpu-offload" in installed
    assert {"kubernetes", "ipykernel", "cloudpickle"} <= installed  # what a kernel needs is there
    assert sorted(installed & {_normalized(n) for n in NOT_IN_BASE}) == []


def test_the_magic_of_the_base_install_runs_a_cell_on_a_sandbox_from_another_venv(lean: Path,
                                                                                 sandbox: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(sandbox), "GPU_OFFLOAD_NAMESPACE": "lean-alice",
           "GPU_OFFLOAD_BACKEND": "kubernetes", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(lean), "-c", DRIVER], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ran in a pod" in done.stdout and "y = 42 error: None" in done.stdout, done.stdout + done.stderr


def test_the_sandbox_command_of_the_base_install_names_the_extra_to_install(lean: Path) -> None:
    done = subprocess.run([str(lean), "-m", "gpu_offload.cli", "sandbox", "--kubeconfig", "/dev/null"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "pip install 'jupyter-gpu-offload[sandbox]'" in done.stderr, done.stderr
