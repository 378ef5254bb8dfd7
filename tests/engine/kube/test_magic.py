"""The magic picks the kubernetes backend from the kernel's environment (as the hub sets it) and runs
cells there through a real IPython shell; a missing setting is a usage error naming it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gpu_offload.liqo_peering.specs import label_value
from gpu_offload.magics.magic import GpuOffloadMagics
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.errors import BackendNotConfigured, OffloadUsageError

from .conftest import STOCK_IMAGE, leftovers


def test_a_configured_kernel_runs_cells_on_the_cluster_without_saying_so(shell: Any, core: Any, namespace: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    shell.user_ns["x"] = 2
    shell.run_cell_magic("gpu_offload", "--gpus 1 --timeout 120", "import os\nprint('pod', os.environ['HOSTNAME'])\ny = x * 21")
    assert shell.user_ns["y"] == 42
    assert "pod gpuo-" in capsys.readouterr().out
    shell.run_line_magic("gpu_offload", "status")
    assert f"kubernetes backend: namespace {namespace}" in capsys.readouterr().out
    wait_until(lambda: not leftovers(core, namespace), "the cell's pod deleted")


def test_without_a_namespace_kubernetes_is_a_usage_error_naming_the_setting(shell: Any, tmp_path: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_OFFLOAD_NAMESPACE")
    # nor a kubeconfig whose context would name one (the namespace falls back to it, as kubectl's does)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    with pytest.raises(BackendNotConfigured) as err:
        shell.run_cell_magic("gpu_offload", "--backend kubernetes", "print('never')")
    assert "GPU_OFFLOAD_NAMESPACE" in str(err.value)


def test_clusters_and_cleanup_line_magics(shell: Any, core: Any, namespace: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_line_magic("gpu_offload", "clusters")
    table = capsys.readouterr().out
    assert "donor-1" in table and "donor-2" in table and "L4" in table
    # no origin-side setting names them, so both donors show as untrusted
    assert "TRUST" in table and table.count("untrusted") == 2
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


def test_the_cleanup_command_removes_a_dead_kernels_runners(origin: Any, core: Any, namespace: str, tmp_path: Any,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_offload.cli import main

    # the kubeconfig's context names the namespace (kubectl's fallback, and the command's)
    kubeconfig = yaml.safe_load(origin.sandbox.kubeconfig.read_text())
    kubeconfig["contexts"][0]["context"]["namespace"] = namespace
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("GPU_OFFLOAD_NAMESPACE", raising=False)
    labels = {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": label_value("alice@example.org"),
              "gpu-offload.io/kernel": "dead-kernel"}
    core.create_namespaced_pod(namespace, {"metadata": {"name": "gpuo-dead", "labels": labels}, "spec": {
        "containers": [{"name": "runner", "image": STOCK_IMAGE, "command": ["python3", "-c", "pass"]}]}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "gpuo-dead-bundle", "labels": labels}})
    assert main(["cleanup", "--namespace", namespace, "--user", "alice@example.org", "--kernel", "other"]) == 0
    assert "0 object(s)" in capsys.readouterr().out
    assert main(["cleanup", "--user", "alice@example.org"]) == 0
    printed = capsys.readouterr().out
    assert "deleted gpuo-dead\n" in printed and "deleted gpuo-dead-bundle\n" in printed
    wait_until(lambda: not leftovers(core, namespace), "the dead kernel's pod and Secret removed")


@pytest.fixture()
def gpu_profile(monkeypatch: pytest.MonkeyPatch) -> str:
    """What the hub's "Remote GPU via Liqo: A100" profile sets in the user's server (before the kernel starts)."""
    monkeypatch.setenv("GPU_OFFLOAD_GPU_MODEL", "A100")
    return "A100"


def test_a_hub_gpu_profile_model_is_the_default_of_cells_that_name_none(
        gpu_profile: str, shell: Any, core: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    # without the profile, most-free placement sends a cell to donor-2 (8 free L4s): see the --noblock test
    handle = shell.run_cell_magic("gpu_offload", "--noblock --timeout 120", "a = 1")
    assert "donor-1" in repr(handle), repr(handle)  # the A100 donor
    assert handle.result()["a"] == 1
    mine = shell.run_cell_magic("gpu_offload", "--noblock --timeout 120 --gpu-model L4", "b = 2")
    assert "donor-2" in repr(mine), repr(mine)  # a cell's own --gpu-model still wins
    assert mine.result()["b"] == 2
    shell.run_line_magic("gpu_offload", "config")
    assert "default_gpu_model = 'A100'" in capsys.readouterr().out
    wait_until(lambda: not leftovers(core, namespace), "the runs' pods deleted")


def test_trusted_only_from_the_cell_the_kernel_setting_or_the_environment_keeps_cells_off_untrusted_donors(
        shell: Any, core: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_offload.engine.errors import OffloadUsageError

    with pytest.raises(OffloadUsageError, match=r"no peered cluster is trusted.*without --trusted-only"):
        shell.run_cell_magic("gpu_offload", "--trusted-only", "y = 1")
    shell.run_line_magic("gpu_offload", "config trusted_only=True")
    with pytest.raises(OffloadUsageError, match="no peered cluster is trusted"):
        shell.run_cell_magic("gpu_offload", "", "y = 1")
    assert "y" not in shell.user_ns and not leftovers(core, namespace)
    # the chart's default reaches a new kernel through the spawner's environment
    monkeypatch.setenv("GPU_OFFLOAD_TRUSTED_ONLY", "1")
    assert GpuOffloadMagics(shell).trusted_only is True
    # trusting a donor (the spawner writes the chart's clusters) lets the same cell run there
    monkeypatch.setenv("GPU_OFFLOAD_TRUSTED_CLUSTERS", "donor-1")
    fresh = GpuOffloadMagics(shell)
    shell.register_magics(fresh)
    try:
        shell.run_cell_magic("gpu_offload", "--timeout 120", "import os\nwhere = os.environ['HOSTNAME']")
    finally:
        fresh.close()
    assert shell.user_ns["where"].startswith("gpuo-")
    wait_until(lambda: not leftovers(core, namespace), "the cell's pod deleted")


def test_gpu_model_takes_a_fallback_list_in_order(shell: Any, core: Any, namespace: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_cell_magic("gpu_offload", "--gpu-model A100,L4", "print('ran')")
    said = capsys.readouterr()
    assert "ran" in said.out and "on virtual node donor-1-gpu (Liqo cluster donor-1, 1 x A100)" in said.out
    # donor-1 has 4 A100: five GPUs fall back to the next model of the list
    shell.run_cell_magic("gpu_offload", "--gpus 5 --gpu-model A100,L4", "print('ran')")
    assert "on virtual node donor-2-gpu (Liqo cluster donor-2, 5 x L4)" in capsys.readouterr().out
    with pytest.raises(OffloadUsageError, match="no virtual node has GPU model 'H100'"):  # a typo is not skipped
        shell.run_cell_magic("gpu_offload", "--gpu-model A100,H100", "print('never')")
    wait_until(lambda: not leftovers(core, namespace), "the cells' pods deleted")
