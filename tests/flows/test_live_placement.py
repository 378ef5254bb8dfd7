"""Placement from the live cluster: real Metaflow asks the sandbox origin (Liqo donors behind the official
client over HTTP) while validating the flow, and refuses what the cluster cannot run.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from gpu_offload.sandbox.apiserver.kubeconfig import write_kubeconfig

from .conftest import NOT_OFFLOADED, OFFLOADED, ONLY_JSON, FlowRunner, templates

pytestmark = pytest.mark.slow


@pytest.fixture
def kubeconfig(cluster: dict[str, str]) -> str:
    return cluster["KUBECONFIG"]


def _live(kubeconfig: str, namespace: str, source: str = "live") -> dict[str, str]:
    return {
        "KUBECONFIG": kubeconfig,
        "METAFLOW_KUBERNETES_NAMESPACE": namespace,
        "METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE": source,
    }


def test_steps_are_placed_on_the_donors_the_cluster_reports(run_flow: FlowRunner, kubeconfig: str) -> None:
    found = templates(run_flow("offload_flow.py", *ONLY_JSON, env=_live(kubeconfig, OFFLOADED)).json())
    assert found["train"]["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-a"
    assert found["train"]["nodeSelector"]["gpu-offload.io/gpu-model"] == "A100"
    assert found["evaluate"]["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-b"


def test_a_namespace_liqo_does_not_offload_is_refused(run_flow: FlowRunner, kubeconfig: str) -> None:
    result = run_flow("offload_flow.py", *ONLY_JSON, env=_live(kubeconfig, NOT_OFFLOADED))
    assert result.returncode != 0
    assert "namespace 'plain' is not offloaded by Liqo" in result.stderr
    assert "{" not in result.stdout


def test_a_step_asking_more_than_any_donor_has_is_refused(run_flow: FlowRunner, kubeconfig: str) -> None:
    env = {**_live(kubeconfig, OFFLOADED), "METAFLOW_GPU_OFFLOAD_CLUSTER": "donor-a"}
    result = run_flow("plain_flow.py", "--with", "gpu_offload:gpus=6", *ONLY_JSON, env=env)
    assert result.returncode != 0
    assert "@gpu_offload(gpus=6): cluster donor-a does not have 6 free GPUs" in result.stderr
    assert "(use @gpu_offload(gpus=4)) [placement from the cluster]" in result.stderr


@pytest.fixture
def dead_kubeconfig(tmp_path: Path) -> str:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return str(write_kubeconfig(tmp_path / "dead-kubeconfig", f"http://127.0.0.1:{port}"))


def test_an_unreachable_cluster_falls_back_to_configuration_in_auto_mode(
    run_flow: FlowRunner, dead_kubeconfig: str
) -> None:
    env = {**_live(dead_kubeconfig, OFFLOADED, source="auto"), "METAFLOW_GPU_OFFLOAD_CLUSTER": "donor-z",
           "GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-z"}  # configuration alone: the configured cluster is trusted
    found = templates(run_flow("plain_flow.py", "--with", "gpu_offload", *ONLY_JSON, env=env).json())
    assert found["start"]["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-z"


def test_an_unreachable_cluster_is_an_error_in_live_mode(run_flow: FlowRunner, dead_kubeconfig: str) -> None:
    result = run_flow("plain_flow.py", "--with", "gpu_offload", *ONLY_JSON, env=_live(dead_kubeconfig, OFFLOADED))
    assert result.returncode != 0
    assert "does not answer" in result.stderr and "METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE=config" in result.stderr


def test_a_step_asking_more_memory_than_any_donor_has_is_refused_before_it_runs(run_flow: FlowRunner,
                                                                                 kubeconfig: str) -> None:
    # 200,000 MB: more than the 128Gi each sandbox donor's virtual node offers, whatever its free GPUs
    result = run_flow("plain_flow.py", "--with", "gpu_offload:gpus=1", "--with", "kubernetes:memory=200000",
                      *ONLY_JSON, env=_live(kubeconfig, OFFLOADED))
    assert result.returncode != 0
    assert "with 186.3 GiB of memory" in result.stderr and "of memory free" in result.stderr, result.stderr
    assert "[placement from the cluster]" in result.stderr


def test_steps_stay_off_untrusted_donors_unless_they_say_untrusted_ok(run_flow: FlowRunner, kubeconfig: str) -> None:
    env = {**_live(kubeconfig, OFFLOADED), "GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-a"}  # donor-b is not trusted
    found = templates(run_flow("plain_flow.py", "--with", "gpu_offload", *ONLY_JSON, env=env).json())
    assert found["start"]["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-a"  # donor-b has more free
    env["GPU_OFFLOAD_TRUSTED_CLUSTERS"] = ""
    refused = run_flow("plain_flow.py", "--with", "gpu_offload", *ONLY_JSON, env=env)
    assert refused.returncode != 0 and "{" not in refused.stdout
    assert "no peered cluster is trusted (donor-a, donor-b are untrusted)" in refused.stderr
    assert "Metaflow's artifacts are pickles" in refused.stderr and "untrusted_ok=True" in refused.stderr
    allowed = run_flow("plain_flow.py", "--with", "gpu_offload:untrusted_ok=True", *ONLY_JSON, env=env)
    assert templates(allowed.json())["start"]["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-b"
