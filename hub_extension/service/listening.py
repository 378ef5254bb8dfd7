"""Where the service listens, and its listening socket, with the standard library alone: ``app`` binds the port
before importing the service, so this module must stay light."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def listen_address(default_port: int) -> tuple[str, int]:
    """Host and port from ``JUPYTERHUB_SERVICE_URL`` (the hub sets it), else all interfaces on ``default_port``
    (0: the URL names no port)."""
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", ""))
    host = url.hostname or "0.0.0.0"
    # In a pod the URL names the hub Service ("hub"), which is not a local address: listen on all.
    if host not in LOCAL_HOSTS:
        host = "0.0.0.0"
    return host, url.port or default_port


def bind(host: str, port: int) -> list[socket.socket]:
    """A listening, non-blocking TCP socket on ``host:port`` (as tornado's own listen makes it), in a list as
    tornado's ``HTTPServer.add_sockets`` takes them. Connections made before the application serves it wait in
    its backlog, and are answered once it does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128)
    sock.setblocking(False)
    return [sock]
