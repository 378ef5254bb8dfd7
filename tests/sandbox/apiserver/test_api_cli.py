"""``gpu-offload sandbox``: writes the kubeconfig only once the API answers, says it is a SANDBOX, serves
until interrupted, refuses bad arguments without leaving anything behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
import yaml

from gpu_offload import cli

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

LIQO_CRDS = Path(__file__).resolve().parents[3] / ".." / "shared" / "liqo-crds"


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpu_offload.cli", "sandbox", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_serves_until_interrupted_and_writes_the_kubeconfig_once_it_answers(tmp_path):
    kubeconfig = tmp_path / "kc" / "config"
    proc = start("--donors", "0", "--kubeconfig", str(kubeconfig), "--crds", str(LIQO_CRDS))
    try:
        banner = [proc.stdout.readline() for _ in range(4)]
        assert "SANDBOX" in banner[1]
        # the banner comes after the kubeconfig was written, which comes after the API answered
        config = yaml.safe_load(kubeconfig.read_text())
        url = config["clusters"][0]["cluster"]["server"]
        assert url.startswith("http://127.0.0.1:") and url in "".join(banner)
        client_config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=client_config)
        with kubernetes.client.ApiClient(client_config) as api:
            names = [n.metadata.name for n in kubernetes.client.CoreV1Api(api).list_namespace().items]
            assert "default" in names
            kinds = kubernetes.client.ApisApi(api).get_api_versions().groups
            assert "offloading.liqo.io" in [g.name for g in kinds]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "sandbox stopped" in out
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("args", "problem"), [
    (["--donors", "-1"], "--donors -1"),
    (["--crds", "/no/such/folder"], "no such folder"),
    (["--port", "70000"], "--port 70000"),
])
def test_bad_arguments_exit_2_and_write_nothing(tmp_path, capsys, args, problem):
    kubeconfig = tmp_path / "config"
    assert cli.main(["sandbox", "--kubeconfig", str(kubeconfig), *args]) == 2
    assert problem in capsys.readouterr().err
    assert not kubeconfig.exists()


def test_a_taken_port_is_reported_and_writes_nothing(tmp_path, capsys):
    kubeconfig = tmp_path / "config"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert cli.main(["sandbox", "--kubeconfig", str(kubeconfig), "--port", str(taken.getsockname()[1])]) == 1
    assert "pick another --port" in capsys.readouterr().err
    assert not kubeconfig.exists()


def test_an_unwritable_kubeconfig_path_is_reported_and_the_server_stops(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["sandbox", "--kubeconfig", str(blocker / "config")]) == 1
    assert "cannot write the kubeconfig" in capsys.readouterr().err


def test_a_malformed_crd_is_named_and_nothing_is_served(tmp_path, capsys):
    crds = tmp_path / "crds"
    crds.mkdir()
    (crds / "broken.yaml").write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
                                      "metadata: {name: widgets.example.com}\nspec: {group: example.com}\n")
    kubeconfig = tmp_path / "config"
    assert cli.main(["sandbox", "--kubeconfig", str(kubeconfig), "--crds", str(crds)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml" in err and "widgets.example.com" in err and "malformed" in err
    assert not kubeconfig.exists()
