"""`gpu-offload sandbox --donors 2 ...` as a user runs it: banner, kubeconfig, a pod that really runs, and
nothing left behind after Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.config import configured, from_environment

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

LIQO_CRDS = Path(__file__).resolve().parents[3] / ".." / "shared" / "liqo-crds"


def test_cli_serves_donors_until_interrupted_and_leaves_no_process(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    cmd = [sys.executable, "-m", "gpu_offload.cli", "sandbox", "--donors", "2", "--gpus", "4", "--gpu-model",
           "H100", "--trusted", "donor-2", "--kubeconfig", str(kubeconfig), "--crds", str(LIQO_CRDS), "--state-dir", str(tmp_path / "st")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: kubeconfig.exists() or proc.poll() is not None, "the kubeconfig", timeout=120)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=config)
        with kubernetes.client.ApiClient(config) as client:
            core = kubernetes.client.CoreV1Api(client)
            gpu_nodes = {n.metadata.name: n.metadata.labels["gpu-offload.io/gpu-model"]
                         for n in core.list_node(label_selector="liqo.io/type=virtual-node").items}
            assert gpu_nodes == {"donor-1-gpu": "H100", "donor-2-gpu": "H100"}
            _, code, headers = core.create_namespaced_config_map_with_http_info(
                "default", {"metadata": {"name": "typo"}, "dta": {"k": "v"}})  # kube-apiserver's default: Warn
            assert code == 201 and headers["Warning"] == '299 - "unknown field \\"dta\\""'
            core.create_namespaced_pod("default", {"metadata": {"name": "sleeper"}, "spec": {"containers": [
                {"name": "main", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(600)"]}]}})
            pod = wait_until(lambda: (p := core.read_namespaced_pod("sleeper", "default")).status.phase == "Running"
                             and p, "the pod to run")
            pid = int(pod.status.container_statuses[0].container_id.rsplit("/", 1)[1])
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "SANDBOX" in output and "donor-2: node donor-2-gpu, 4 x H100" in output
    # trust stays an origin-side setting the user exports; donor-1 was not named, so it is not trusted
    assert "donor-1: node donor-1-gpu, 4 x H100, 2.00 per GPU-hour, untrusted" in output
    assert "export GPU_OFFLOAD_TRUSTED_CLUSTERS=donor-2\n" in output
    # the two lines that make the kubernetes backend work, and what the backend makes of them
    exports = [line.split("export ", 1)[1] for line in output.splitlines() if "export KUBECONFIG" in line
               or "export GPU_OFFLOAD_BACKEND" in line]
    assert exports == [f"KUBECONFIG={kubeconfig}", "GPU_OFFLOAD_BACKEND=kubernetes"]
    environment = dict(e.split("=", 1) for e in exports)
    assert configured(environment) and from_environment(environment).namespace == "default"
    assert proc.returncode == 0, output
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_cli_refuses_bad_prices_with_the_fix(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gpu_offload.cli", "sandbox", "--donors", "2", "--prices", "1.0",
                             "--kubeconfig", str(tmp_path / "kc")], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "give one per donor or none" in result.stderr
    assert not (tmp_path / "kc").exists()


def test_cli_refuses_to_trust_a_donor_it_does_not_have(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gpu_offload.cli", "sandbox", "--donors", "2", "--trusted",
                             "donor-3", "--kubeconfig", str(tmp_path / "kc")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "--trusted donor-3: no such donor; the donors are donor-1, donor-2" in result.stderr
    assert not (tmp_path / "kc").exists()
    bare = subprocess.run([sys.executable, "-m", "gpu_offload.cli", "sandbox", "--trusted", "donor-1",
                           "--kubeconfig", str(tmp_path / "kc")], capture_output=True, text=True, timeout=120)
    assert bare.returncode != 0 and "no donors to trust; add --donors N" in bare.stderr
