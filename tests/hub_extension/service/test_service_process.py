"""The service as a process: a token it has not seen yet is checked with the hub without holding up anyone
else's request, and its log keeps what an operator reads (refusals, changes), not every answered poll.

The service runs as JupyterHub runs it (``python -m gpu_offload.hub_extension.service.app`` with the hub's
``JUPYTERHUB_*`` variables) against the sandbox origin; its hub API is a stand-in answering
``GET /hub/api/user`` as JupyterHub does (the token's owner model), which can hold an answer back until the
test lets it go. That hold is the ordering: no sleep, no duration is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
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
           "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.server_address[1]}/hub/api"}
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
