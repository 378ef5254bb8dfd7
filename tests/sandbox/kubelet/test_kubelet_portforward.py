"""``pods/portforward`` through the official client's ``kubernetes.stream.portforward``: bytes reach a
pod's port and come back; a port nothing listens on is reported on the port's error channel."""

from __future__ import annotations

import socket

from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from kubernetes.stream import portforward

core, namespace = fixtures.core, fixtures.namespace

SERVE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('you asked for ' + self.path).encode()
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(('0.0.0.0', int(sys.argv[1])), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_all(sock) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_portforward_reaches_the_pods_port_and_reports_a_closed_one(core, namespace):
    port, closed = _free_port(), _free_port()
    core.create_namespaced_pod(namespace, {"metadata": {"name": "web"}, "spec": {
        "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": "python:3.12", "command": ["python3", "-c", SERVE, str(port)],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}})
    wait_until(lambda: (s := core.read_namespaced_pod("web", namespace).status.container_statuses) and s[0].ready,
               "ready")
    forward = portforward(core.connect_get_namespaced_pod_portforward, "web", namespace, ports=f"{port},{closed}")
    sock = forward.socket(port)
    sock.setblocking(True)
    sock.sendall(b"GET /hello HTTP/1.0\r\nHost: web\r\n\r\n")
    reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"you asked for /hello")
    assert forward.error(port) is None
    assert "error forwarding port" in wait_until(lambda: forward.error(closed), "the closed port's error")
    forward.close()
