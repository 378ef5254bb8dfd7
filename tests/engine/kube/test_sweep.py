"""The orphan sweep of the runs server extension: a real jupyter server on the sandbox deletes the runner pod
of a kernel that crashed (and was restarted under the same id), and never the pod of a live kernel."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.specs import runner_selector
from gpu_offload.magics.runs_api import server_identity
from gpu_offload.sandbox.fixtures import stop_process, wait_until
from jupyter_client import BlockingKernelClient

from gpu_offload.engine.backends.kube.sweep import orphan_selectors

from .conftest import STOCK_IMAGE, leftovers

USER = getpass.getuser()


def test_a_pod_is_an_orphan_when_its_kernel_is_gone_or_lives_on_under_another_pid() -> None:
    pods = [
        {L.KERNEL: "alive", L.KERNEL_PID: "10"},
        {L.KERNEL: "gone", L.KERNEL_PID: "11"},
        {L.KERNEL: "restarted", L.KERNEL_PID: "12"},
        {L.KERNEL: "restarting", L.KERNEL_PID: "13"},
        {L.KERNEL: "no-pid-label"},
    ]
    live = {"alive": 10, "restarted": 99, "restarting": None, "no-pid-label": 7}
    assert orphan_selectors(pods, live) == {f"{L.KERNEL}=gone", f"{L.KERNEL}=restarted,{L.KERNEL_PID}=12"}


def test_a_cli_run_is_never_an_orphan_even_with_a_server_label() -> None:
    pods = [{L.KERNEL: "cli-host-1", L.KERNEL_PID: "1", L.SERVER: "s", L.ORIGIN: L.ORIGIN_CLI},
            {L.KERNEL: "gone", L.KERNEL_PID: "2", L.SERVER: "s"}]
    assert orphan_selectors(pods, {}) == {f"{L.KERNEL}=gone"}


def test_a_hub_server_keeps_its_identity_across_restarts_and_a_plain_one_does_not() -> None:
    hub = {"JUPYTERHUB_USER": "alice", "JUPYTERHUB_SERVER_NAME": "gpu"}
    assert server_identity(hub) == server_identity(dict(hub)) == "hub-gpu"
    assert server_identity({"JUPYTERHUB_USER": "alice"}) == "hub-default"
    assert str(os.getpid()) in server_identity({})


@dataclass
class Server:
    url: str
    token: str
    runtime: Path

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=data,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
            return json.loads(text) if text else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def server(origin: Any, namespace: str, tmp_path: Path) -> Iterator[Server]:
    """``jupyter server`` with the runs extension, configured for the sandbox, sweeping every second."""
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "KUBECONFIG": str(origin.sandbox.kubeconfig), "GPU_OFFLOAD_NAMESPACE": namespace,
           "GPU_OFFLOAD_IMAGE": STOCK_IMAGE, "GPU_OFFLOAD_SWEEP_SECONDS": "1",
           "GPU_OFFLOAD_STATE_DIR": str(tmp_path / "runs"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    for key in ("GPU_OFFLOAD_SERVICE_URL", "GPU_OFFLOAD_BACKEND", "GPU_OFFLOAD_SERVER_ID", "JUPYTERHUB_USER"):
        env.pop(key, None)
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--ServerApp.jpserver_extensions={'gpu_offload.magics.runs_api': True}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    started = Server(f"http://127.0.0.1:{port}", token, tmp_path / "runtime")

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter server exited: {(tmp_path / 'server.log').read_text()[-3000:]}")
        try:
            return started.api("GET", "/api/status") is not None
        except OSError:
            return False

    try:
        wait_until(answers, "jupyter server answering", timeout=120, every=0.5)
        yield started
    finally:
        stop_process(proc)
        log.close()


def _client(server: Server, kernel_id: str) -> BlockingKernelClient:
    client = BlockingKernelClient(connection_file=str(server.runtime / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    # without a KernelManager the client judges the kernel alive by heartbeats, which it gives up on after 1 s
    # by default: a loaded machine starting a kernel misses that, so the kernel is given as long as it needs
    client.hb_channel.time_to_dead = 30.0
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return client


def _run(client: BlockingKernelClient, code: str) -> str:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = client.execute_interactive(code, timeout=180, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


def test_the_server_sweeps_the_pod_of_a_crashed_kernel_and_spares_the_live_one(server: Server, core: Any,
                                                                                namespace: str) -> None:
    kernel_id = server.api("POST", "/api/kernels", {"name": "python3"})["id"]
    client = _client(server, kernel_id)
    try:
        pid = int(_run(client, "import os; print(os.getpid())").strip())
        _run(client, "%load_ext gpu_offload.magics")
        _run(client, "%%gpu_offload --gpus 1 --noblock\nimport time\ntime.sleep(300)")
        pods = wait_until(lambda: core.list_namespaced_pod(namespace, label_selector=runner_selector(USER)).items,
                          "the runner pod created")
        labels = pods[0].metadata.labels
        assert labels[L.KERNEL] == kernel_id and labels[L.KERNEL_PID] == str(pid) and labels.get(L.SERVER)
        time.sleep(3)  # three sweeps of a live kernel: its pod stays
        assert leftovers(core, namespace, USER), "the sweep removed the pod of a live kernel"

        os.kill(pid, signal.SIGKILL)  # the kernel dies without cleaning up; the server restarts it, same id
        wait_until(lambda: not leftovers(core, namespace, USER), "the crashed kernel's pod and Secret swept",
                   timeout=90)
        assert kernel_id in [k["id"] for k in server.api("GET", "/api/kernels")]
    finally:
        client.stop_channels()
        # whatever the outcome, nothing of this test stays in the sandbox
        for pod in core.list_namespaced_pod(namespace, label_selector=runner_selector(USER)).items:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        for secret in core.list_namespaced_secret(namespace, label_selector=runner_selector(USER)).items:
            core.delete_namespaced_secret(secret.metadata.name, namespace)
