"""The magic picks the kubernetes backend from the kernel's environment (as the hub sets it) and runs
cells there through a real IPython shell; a missing setting is a usage error naming it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.liqo_peering.specs import label_value
from gpu_offload.magics.errors import BackendNotConfigured
from gpu_offload.magics.magic import GpuOffloadMagics
from gpu_offload.sandbox.fixtures import wait_until
from IPython.core.interactiveshell import InteractiveShell

from .conftest import STOCK_IMAGE, leftovers


@pytest.fixture()
def shell(origin: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real IPython shell whose magic builds its backend from the environment, like a user's server."""
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.setenv("GPU_OFFLOAD_NAMESPACE", namespace)
    monkeypatch.setenv("GPU_OFFLOAD_IMAGE", STOCK_IMAGE)
    monkeypatch.setenv("GPU_OFFLOAD_KERNEL_ID", f"k-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("JUPYTERHUB_USER", "alice@example.org")
    monkeypatch.delenv("GPU_OFFLOAD_BACKEND", raising=False)
    ipython = InteractiveShell.instance()
    ipython.reset()
    magics = GpuOffloadMagics(ipython)
    ipython.register_magics(magics)
    yield ipython
    magics.close()


def test_a_configured_kernel_runs_cells_on_the_cluster_without_saying_so(shell: Any, core: Any, namespace: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    shell.user_ns["x"] = 2
    shell.run_cell_magic("gpu_offload", "--gpus 1 --timeout 120", "import os\nprint('pod', os.environ['HOSTNAME'])\ny = x * 21")
    assert shell.user_ns["y"] == 42
    assert "pod gpuo-" in capsys.readouterr().out
    shell.run_line_magic("gpu_offload", "status")
    assert f"kubernetes backend: namespace {namespace}" in capsys.readouterr().out
    wait_until(lambda: not leftovers(core, namespace), "the cell's pod deleted")


def test_without_a_namespace_kubernetes_is_a_usage_error_naming_the_setting(shell: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_OFFLOAD_NAMESPACE")
    with pytest.raises(BackendNotConfigured) as err:
        shell.run_cell_magic("gpu_offload", "--backend kubernetes", "print('never')")
    assert "GPU_OFFLOAD_NAMESPACE" in str(err.value)


def test_clusters_and_cleanup_line_magics(shell: Any, core: Any, namespace: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_line_magic("gpu_offload", "clusters")
    table = capsys.readouterr().out
    assert "donor-1" in table and "donor-2" in table and "L4" in table
    # a pod this kernel left behind (e.g. before a crash) is found by its labels and removed
    backend = shell.magics_manager.registry["GpuOffloadMagics"]._backends["kubernetes"]
    core.create_namespaced_pod(namespace, {"metadata": {"name": "gpuo-left", "labels": {
        "gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": label_value("alice@example.org"),
        "gpu-offload.io/kernel": backend.settings.kernel}},
        "spec": {"containers": [{"name": "runner", "image": STOCK_IMAGE, "command": ["python3", "-c", "pass"]}]}})
    shell.run_line_magic("gpu_offload", "cleanup")
    assert "deleted 1 object(s) of kernel" in capsys.readouterr().out
    wait_until(lambda: not leftovers(core, namespace), "the leftover pod deleted")


def test_a_noblock_handle_shows_phase_cluster_and_elapsed_time(shell: Any, core: Any, namespace: str) -> None:
    handle = shell.run_cell_magic("gpu_offload", "--noblock",
                                  "import time\nprint('working', flush=True)\ntime.sleep(1)\nz = 7")
    shown = repr(handle)
    assert "on donor-2" in shown or "for donor-2" in shown, shown
    assert " s" in shown and ("Pending" in shown or "Running" in shown), shown
    assert handle.result()["z"] == 7
    assert shell.user_ns["z"] == 7
    wait_until(lambda: not leftovers(core, namespace), "the --noblock run's pod deleted")


def test_the_cleanup_command_removes_a_dead_kernels_runners(origin: Any, core: Any, namespace: str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_offload.cli import main

    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    labels = {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": label_value("alice@example.org"),
              "gpu-offload.io/kernel": "dead-kernel"}
    core.create_namespaced_pod(namespace, {"metadata": {"name": "gpuo-dead", "labels": labels}, "spec": {
        "containers": [{"name": "runner", "image": STOCK_IMAGE, "command": ["python3", "-c", "pass"]}]}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "gpuo-dead-bundle", "labels": labels}})
    assert main(["cleanup", "--namespace", namespace, "--user", "alice@example.org", "--kernel", "other"]) == 0
    assert "0 object(s)" in capsys.readouterr().out
    assert main(["cleanup", "--namespace", namespace, "--user", "alice@example.org"]) == 0
    printed = capsys.readouterr().out
    assert "deleted gpuo-dead\n" in printed and "deleted gpuo-dead-bundle\n" in printed
    wait_until(lambda: not leftovers(core, namespace), "the dead kernel's pod and Secret removed")
