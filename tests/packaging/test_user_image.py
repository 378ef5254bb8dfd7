"""The user server image built here: `jupyterhub-singleuser` starts with the runs extension loaded, and a
kernel has the %%gpu_offload magic without %load_ext (the IPython profile preloads it) and runs a cell."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpu_offload.images import manifest

from .conftest import Container, labels

SPEC = manifest().role("singleuser")[0]
PREFIX = "/user/alice/"
# What a hub's spawner gives a server (JUPYTERHUB_API_URL is added per test).
HUB_ENV = {
    "JUPYTERHUB_API_TOKEN": "not-a-real-token",
    "JUPYTERHUB_BASE_URL": "/",
    "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-alice",
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
    "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{PREFIX}oauth_callback",
    "JUPYTERHUB_HOST": "",
}
CHECK_KERNEL = r"""
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
try:
    out = []
    def keep(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])
    kc.execute_interactive("print('magic:', get_ipython().find_cell_magic('gpu_offload') is not None)",
                           output_hook=keep, timeout=120)
    kc.execute_interactive("%%gpu_offload --backend local\ny = 6 * 7", output_hook=keep, timeout=120)
    kc.execute_interactive("print('y =', y)", output_hook=keep, timeout=60)
    print("".join(out))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _HubVersion(BaseHTTPRequestHandler):
    """The one request a single-user server makes of its hub before it starts: GET the API's root, whose
    X-JupyterHub-Version header it compares with its own (it exits when no hub answers)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        import jupyterhub

        self.send_response(200 if self.path.rstrip("/") == "/hub/api" else 404)
        self.send_header("X-JupyterHub-Version", jupyterhub.__version__)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"version": "%s"}' % jupyterhub.__version__.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _HubVersion)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/hub/api"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server(built: None, hub_api: str) -> Iterator[tuple[Container, int]]:
    port = _free_port()
    env = [f"--env={k}={v}" for k, v in {**HUB_ENV, "JUPYTERHUB_API_URL": hub_api,
                                          "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}{PREFIX}"}.items()]
    container = Container(SPEC.image, ["jupyterhub-singleuser", "--ip=127.0.0.1", f"--port={port}"], env)
    try:
        yield container, port
    finally:
        container.remove()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_server_starts_with_the_runs_extension_and_serves_its_api(server: tuple[Container, int]) -> None:
    container, port = server
    deadline = time.monotonic() + 180  # a guard against a server that never starts, not a speed claim
    while time.monotonic() < deadline:
        try:
            status = _status(f"http://127.0.0.1:{port}{PREFIX}api")
            break
        except OSError:
            assert container.running(), f"jupyterhub-singleuser exited:\n{container.logs()}"
            time.sleep(1)
    else:
        raise AssertionError(f"jupyterhub-singleuser did not listen:\n{container.logs()}")
    assert status == 200, container.logs()
    logs = container.logs()
    assert "gpu_offload.magics.runs_api | extension was successfully loaded" in logs, logs
    # the extension's route exists and asks for the hub's login (an unknown path would be 404)
    assert _status(f"http://127.0.0.1:{port}{PREFIX}gpu-offload/runs") == 403
    assert _status(f"http://127.0.0.1:{port}{PREFIX}gpu-offload/no-such-thing") == 404


def test_a_kernel_has_the_magic_without_load_ext_and_runs_a_cell(server: tuple[Container, int]) -> None:
    container, _ = server
    done = container.exec("python3", "-c", CHECK_KERNEL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "magic: True" in done.stdout and "y = 42" in done.stdout, done.stdout + done.stderr


def test_the_labels_declare_the_kernels_versions(built: None) -> None:
    keys = manifest().labels
    assert labels(SPEC.image)[keys["python"]] == SPEC.declared.python
    assert labels(SPEC.image)[keys["cloudpickle"]] == SPEC.declared.cloudpickle
