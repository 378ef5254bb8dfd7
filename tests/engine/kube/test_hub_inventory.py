"""In a hub deployment the kernel reads the inventory from the hub service's user-scoped API (users hold no
cluster-wide rights) and places with it; a stand-in service answers with the hub's own view function."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.hub_extension.service.views import user_inventory
from gpu_offload.liqo_peering.client import LiqoClient

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.hub_inventory import HubInventory, HubInventoryError

from .conftest import settings
from .helpers import run_cell

TOKEN = "server-token-1"


@pytest.fixture()
def hub_service(api_client: Any) -> Iterator[tuple[str, list[str]]]:
    """``/api/inventory`` answered from the sandbox through the hub's view; records the tokens it saw."""
    seen: list[str] = []
    liqo = LiqoClient(api_client, request_timeout=30)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.headers.get("Authorization", ""))
            if self.path != "/services/gpu-offload/api/inventory" or seen[-1] != f"token {TOKEN}":
                self.send_error(403)
                return
            body = json.dumps(user_inventory(liqo.read_inventory()), default=str).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/services/gpu-offload/", seen
    server.shutdown()
    server.server_close()


def test_placement_uses_the_hub_services_inventory(api_client: Any, namespace: str, core: Any,
                                                  hub_service: tuple[str, list[str]]) -> None:
    url, seen = hub_service
    backend = KubernetesBackend(settings(namespace, service_url=url, hub_token=TOKEN), api_client)
    try:
        outcome, _, run = run_cell(backend, "print('placed by the hub inventory')", {}, gpu_model="A100")
        assert outcome.status == "ok", outcome.error
        assert run.current.ctx.cluster == "donor-1"
        assert isinstance(backend.inventory(), HubInventory) and seen == [f"token {TOKEN}"]
    finally:
        backend.close()


def test_a_refused_token_says_what_to_do(hub_service: tuple[str, list[str]]) -> None:
    url, _ = hub_service
    with pytest.raises(HubInventoryError) as err:
        HubInventory(url, "wrong").inventory()
    assert "HTTP 403" in str(err.value) and "restart your server" in str(err.value)


def test_a_server_account_without_list_or_offloading_read_rights_still_runs_cells(
        api_client: Any, namespace: str, origin: Any, hub_service: tuple[str, list[str]]) -> None:
    # the hub offloaded the namespace when the server started; the server's account may not read that object
    # nor list Secrets (the chart's user-server role): both answer 403 here
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings", {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "LocalAndRemote"}})
    origin.faults.api_error(r"/namespaces/[^/]+/secrets$", status=403, methods=("GET",))
    origin.faults.api_error(r"/namespaceoffloadings/offloading$", status=403, methods=("GET",))
    try:
        url, _ = hub_service
        backend = KubernetesBackend(settings(namespace, service_url=url, hub_token=TOKEN, create_offloading=False),
                                    api_client)
        try:
            assert backend.cleaned == []
            outcome, sink, _ = run_cell(backend, "print('ran without those rights')", {})
            assert outcome.status == "ok", outcome.error
            assert "ran without those rights" in sink.text
        finally:
            backend.close()
    finally:
        origin.faults.clear()
