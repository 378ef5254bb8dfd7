"""JupyterHub's configuration file for a hub on this machine that runs the gpu-offload service: the one
``gpu-offload lab --hub`` starts and the one the hub tests start, built here so both run the service as
the Helm chart (``jupyterhub.hub.services`` in ``helm/gpu-offload/values.yaml``) declares it.

Pure: :func:`config_text` returns the file's text; callers append their own lines (users, roles, the
spawner) made with :func:`assign`, which writes values as Python literals (never by pasting text into
code).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .handlers import MANAGE_SCOPE, VIEW_SCOPE

SERVICE_NAME = "gpu-offload"
CUSTOM_SCOPES = {
    VIEW_SCOPE: {"description": "See the GPU offload admin pages."},
    MANAGE_SCOPE: {"description": "Change GPU lending."},
}
ADMIN = "admin"
"""The hub admin's user name (the dummy authenticator lets anyone log in under any name)."""


@dataclass(frozen=True)
class LocalHub:
    """Where the hub, its proxy and the service listen, and what the service is given."""

    workdir: Path
    """The hub's database and cookie secret go here."""
    proxy: str
    """The configurable-http-proxy executable."""
    port: int
    """The public port (the proxy) on 127.0.0.1."""
    hub_port: int
    proxy_api_port: int
    service_port: int
    service_environment: Mapping[str, str] = field(default_factory=dict)
    """The service's environment (a hub-managed service inherits almost nothing of the hub's)."""
    hub_ip: str = "127.0.0.1"
    """Where the hub's API listens: an address user servers reach (in pods: the sandbox's host address)."""
    service_ip: str = "127.0.0.1"
    """Where the service listens, for the proxy and for user servers, as ``hub_ip``."""
    python: str = sys.executable

    @property
    def url(self) -> str:
        """The public URL (the proxy)."""
        return f"http://127.0.0.1:{self.port}/"

    @property
    def service_url(self) -> str:
        """The service reached directly, as user servers call it (the chart's hub Service port)."""
        return f"http://{self.service_ip}:{self.service_port}/services/{SERVICE_NAME}/"


def assign(target: str, value: Any) -> str:
    """One configuration line, ``c.<target> = <value as a Python literal>``."""
    return f"c.{target} = {value!r}"


def service(hub: LocalHub) -> dict[str, Any]:
    """The service's entry in ``JupyterHub.services`` (the overlay's ``hub.services.gpu-offload``)."""
    return {
        "name": SERVICE_NAME,
        "url": f"http://{hub.service_ip}:{hub.service_port}",
        "command": [hub.python, "-m", "gpu_offload.hub_extension.service.app"],
        "display": True,
        "oauth_no_confirm": True,
        # without these a token from the service's OAuth carries no custom scope (the overlay says why)
        "oauth_client_allowed_scopes": [VIEW_SCOPE, MANAGE_SCOPE],
        "environment": dict(hub.service_environment),
    }


def config_text(hub: LocalHub, extra: Sequence[str] = (), services: Sequence[Mapping[str, Any]] = ()) -> str:
    """The configuration file: hub, proxy, dummy authenticator with ``admin`` as admin, the custom scopes and
    the service (after ``services``), then the ``extra`` lines."""
    lines = [
        "c = get_config()  # noqa",
        assign("JupyterHub.ip", "127.0.0.1"),
        assign("JupyterHub.port", hub.port),
        assign("JupyterHub.hub_ip", hub.hub_ip),
        assign("JupyterHub.hub_port", hub.hub_port),
        assign("ConfigurableHTTPProxy.api_url", f"http://127.0.0.1:{hub.proxy_api_port}"),
        assign("ConfigurableHTTPProxy.command", [hub.proxy]),
        assign("JupyterHub.authenticator_class", "dummy"),
        assign("Authenticator.admin_users", {ADMIN}),
        assign("JupyterHub.db_url", f"sqlite:///{hub.workdir}/jupyterhub.sqlite"),
        assign("JupyterHub.cookie_secret_file", str(hub.workdir / "cookie_secret")),
        assign("JupyterHub.custom_scopes", CUSTOM_SCOPES),
        assign("JupyterHub.services", [*map(dict, services), service(hub)]),
        *extra,
    ]
    return "\n".join(lines) + "\n"
