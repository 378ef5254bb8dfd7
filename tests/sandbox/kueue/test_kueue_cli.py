"""``gpu-offload sandbox --kueue`` with ``--crds`` given twice: Liqo's and Kueue's kinds are served, Kueue's
webhook gates a queued pod, and bad Kueue options are refused with the fix."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import kubernetes
import pytest
from gpu_offload.sandbox.arguments import add_kueue_arguments
from gpu_offload.sandbox.kueue import cli as kueue_cli

from gpu_offload import cli

from ..kueue_setup import KUEUE_CRDS, LIQO_CRDS, gpu_pod


@pytest.mark.e2e  # starts a process
def test_kueue_flag_serves_both_crd_folders_and_gates_queued_pods(tmp_path):
    kubeconfig = tmp_path / "config"
    proc = subprocess.Popen([sys.executable, "-m", "gpu_offload.cli", "sandbox", "--kubeconfig", str(kubeconfig),
                             "--crds", str(LIQO_CRDS), "--crds", str(KUEUE_CRDS), "--kueue"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(5)]
        assert any("Kueue emulated" in line for line in lines)
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=config)
        with kubernetes.client.ApiClient(config) as api:
            groups = [g.name for g in kubernetes.client.ApisApi(api).get_api_versions().groups]
            assert {"offloading.liqo.io", "kueue.x-k8s.io"} <= set(groups)
            pod = kubernetes.client.CoreV1Api(api).create_namespaced_pod("default", gpu_pod("q", "user-queue"))
            assert [g.name for g in pod.spec.scheduling_gates] == ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("args", "problem"), [
    (["--kueue-pods-ready-timeout", "5"], "needs --kueue"),
    (["--kueue-exclude-resource-prefix", "ephemeral-storage"], "needs --kueue"),
    (["--kueue", "--kueue-pods-ready-timeout", "-1"], "0 turns waitForPodsReady off"),
])
def test_bad_kueue_options_are_refused_with_the_fix(tmp_path, capsys, args, problem):
    kubeconfig = tmp_path / "config"
    with pytest.raises(SystemExit) as exc:
        cli.main(["sandbox", "--kubeconfig", str(kubeconfig), *args])
    assert problem in str(exc.value)
    assert not kubeconfig.exists()



@pytest.mark.parametrize(("args", "timeout"), [([], 1800.0), (["--kueue-pods-ready-timeout", "5"], 5.0),
                                               (["--kueue-pods-ready-timeout", "0"], None)])
def test_wait_for_pods_ready_is_on_by_default_as_in_kueue_019_and_zero_turns_it_off(args, timeout):
    parser = argparse.ArgumentParser()
    add_kueue_arguments(parser)
    (plugin,) = kueue_cli.plugins(parser.parse_args(["--kueue", *args]))
    assert plugin.__self__.options.pods_ready_timeout == timeout
