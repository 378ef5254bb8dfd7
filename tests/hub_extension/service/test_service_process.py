"""The service as a process: a token it has not seen yet is checked with the hub without holding up anyone
else's request, and its log keeps what an operator reads (refusals, changes), not every answered poll.

The service runs as JupyterHub runs it (``python -m gpu_offload.hub_extension.service.app`` with the hub's
``JUPYTERHUB_*`` variables) against the sandbox origin; its hub API is a stand-in answering
``GET /hub/api/user`` as JupyterHub does (the token's owner model), which can hold an answer back until the
test lets it go. That hold is the ordering: no sleep, no duration is asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_offload.sandbox.fixtures import stop_process, wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..conftest import free_port, http

PREFIX = "/services/gpu-offload/"
HELD = "token-whose-check-the-hub-holds"
KNOWN = "token-the-service-has-checked-before"


@dataclass
class StandInHubApi:
    """JupyterHub's ``/hub/api/user``: a user model per token; the check of ``HELD`` waits for ``release``."""

    release: threading.Event = field(default_factory=threading.Event)
    seen: list[str] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                token = self.headers.get("Authorization", "").partition(" ")[2]
                api.seen.append(token)
                if token == HELD:
                    api.release.wait(120)
                body = json.dumps({"kind": "user", "name": token[:5], "admin": False, "groups": [],
                                   "scopes": ["access:services!service=gpu-offload"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@dataclass(frozen=True)
class RunningService:
    url: str
    hub_api: StandInHubApi
    log: Path
    """What the service wrote to stdout and stderr."""


@pytest.fixture()
def service(origin: RunningOrigin, tmp_path: Path) -> Iterator[RunningService]:
    """The service on 127.0.0.1, its hub API the stand-in."""
    with _started(origin, tmp_path, {}) as running:
        yield running


@contextlib.contextmanager
def _started(origin: RunningOrigin, tmp_path: Path, extra_env: dict[str, str]) -> Iterator[RunningService]:
    api = StandInHubApi()
    hub = ThreadingHTTPServer(("127.0.0.1", 0), api.handler())
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    port = free_port()
    (tmp_path / "gpu-offload.yaml").write_text(yaml.safe_dump({"usageDatabase": {"url": f"sqlite:///{tmp_path}/u.sqlite"}}))
    env = {**os.environ, "KUBECONFIG": str(origin.sandbox.kubeconfig),
           "GPU_OFFLOAD_CONFIG": str(tmp_path / "gpu-offload.yaml"),
           "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}", "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
           "JUPYTERHUB_SERVICE_NAME": "gpu-offload", "JUPYTERHUB_CLIENT_ID": "service-gpu-offload",
           "JUPYTERHUB_API_TOKEN": "the-services-own-token",
           "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.server_address[1]}/hub/api", **extra_env}
    log = (tmp_path / "service.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpu_offload.hub_extension.service.app"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        yield RunningService(f"http://127.0.0.1:{port}{PREFIX}", api, tmp_path / "service.log")
    finally:
        api.release.set()
        stop_process(proc)
        log.close()
        hub.shutdown()
        hub.server_close()


def _wait_for_answers(url: str) -> None:
    def answers() -> bool:
        try:
            return http("GET", f"{url}api/inventory", KNOWN).status == 200
        except OSError:
            return False
    wait_until(answers, "the service to answer with its inventory", timeout=120, every=0.3)


def test_a_request_is_answered_while_another_tokens_check_with_the_hub_is_pending(service: RunningService) -> None:
    url, api = service.url, service.hub_api
    _wait_for_answers(url)
    held: list[Any] = []
    waiting = threading.Thread(target=lambda: held.append(http("GET", f"{url}api/inventory", HELD)), daemon=True)
    waiting.start()
    wait_until(lambda: HELD in api.seen, "the service to ask the hub about the new token")
    # the new token's check is still held by the hub: a known token is answered meanwhile
    assert http("GET", f"{url}api/inventory", KNOWN).status == 200
    assert not held and api.seen.count(KNOWN) == 1  # from HubAuth's token cache, not asked again
    api.release.set()
    waiting.join(120)
    assert held and held[0].status == 200


def test_answered_reads_are_not_logged_but_refusals_are(service: RunningService) -> None:
    _wait_for_answers(service.url)  # answered GETs of api/inventory: 200s, at debug level
    refused = http("GET", f"{service.url}api/admin/clusters", KNOWN)  # the token lacks the view scope
    assert refused.status == 403
    line = f"403 GET {PREFIX}api/admin/clusters"
    wait_until(lambda: line in service.log.read_text(), "the refusal in the service's log")
    # the log is written in request order: every earlier 200 would be above the refusal by now
    assert f"200 GET {PREFIX}api/inventory" not in service.log.read_text()


def test_the_port_takes_connections_before_the_slow_imports_and_answers_them_once_up(
        origin: RunningOrigin, tmp_path: Path) -> None:
    """JupyterHub 5.4 gives a managed service ten one-second tries; a refused try fails at once, a request on a
    port that is listening waits for its answer. The service binds its port before importing the Kubernetes
    client and JupyterHub's auth (tens of seconds on a loaded node): a request sent as soon as the port takes
    connections is answered once the service is up. Python's import log (``-X importtime``, written as each
    import ends) says which imports had happened when the port took the connection."""
    with _started(origin, tmp_path, {"PYTHONPROFILEIMPORTTIME": "1"}) as running:
        url = urllib.parse.urlparse(running.url)
        conn = _first_connection(url.hostname or "", url.port or 0)
        imported_then = running.log.read_text()
        with conn:
            conn.sendall(f"GET {PREFIX}api/inventory HTTP/1.1\r\nHost: {url.netloc}\r\n"
                         f"Authorization: token {KNOWN}\r\nConnection: close\r\n\r\n".encode())
            conn.settimeout(120)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert "gpu_offload.hub_extension.service.listening" in imported_then, "the import log was not on"
        assert not _imported("kubernetes", imported_then) and not _imported("jupyterhub.services.auth", imported_then), (
            "the port took connections only after the slow imports")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert _imported("kubernetes", running.log.read_text())  # imported after all, once the port was taken


def _imported(module: str, import_log: str) -> bool:
    """Whether ``-X importtime``'s log names ``module`` (a line ``import time: self | cumulative |  name``)."""
    return re.search(rf"^import time:.*\|\s+{re.escape(module)}$", import_log, re.MULTILINE) is not None


def _first_connection(host: str, port: int) -> socket.socket:
    """A connection to host:port as soon as it is accepted (tried every 10 ms for up to 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return socket.create_connection((host, port), timeout=1)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
