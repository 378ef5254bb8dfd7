"""The service's tornado application and its life: the pages and APIs under ``JUPYTERHUB_SERVICE_PREFIX``, the
watches behind them, served on sockets ``app`` bound before importing this module.

Modelled on JupyterHub's ``examples/service-whoami``: a tornado app whose handlers are HubOAuthenticated.
Kubernetes access: in-cluster service account, else ``KUBECONFIG``. Configuration: ``GPU_OFFLOAD_CONFIG``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket

from gpu_offload.liqo_peering.client import api_client_from_environment
from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.log import access_log

from ..accounting.store import Store
from ..config import HubConfig
from . import handlers as h
from .listening import bind, listen_address
from .operations import Operations
from .state import HubState
from .uploads import KubeconfigVault

log = logging.getLogger("gpu_offload.hub")


def log_request(handler: web.RequestHandler) -> None:
    """The access log line of one request, as tornado writes it, except that answered reads (GET and HEAD
    below 400: the kernels' and dashboards' polling, hundreds a second on a big hub) go to debug level, as
    JupyterHub logs its static files and 304s; changes (POST), refusals and errors stay at info and above."""
    status = handler.get_status()
    if status < 400 and handler.request.method in ("GET", "HEAD"):
        level = logging.DEBUG
    else:
        level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if access_log.isEnabledFor(level):  # the line is not even formatted when nobody reads it
        access_log.log(level, "%d %s %.2fms", status, handler._request_summary(),
                       1000.0 * handler.request.request_time())


def make_app(state: HubState, operations: Operations, prefix: str) -> web.Application:
    """The tornado application under ``prefix`` (ends with ``/``)."""
    args = {"state": state, "operations": operations, "prefix": prefix, "vault": KubeconfigVault()}
    routes: list[tuple[str, type[web.RequestHandler]]] = [
        ("", h.ClustersPage),
        ("clusters/([^/]+)", h.ClusterPage),
        ("users", h.UsersPage),
        ("queues", h.QueuesPage),
        ("audit", h.AuditPage),
        ("actions/([a-z]+)", h.ActionPage),
        ("api/admin/clusters", h.ClustersApi),
        ("api/admin/clusters/([^/]+)", h.ClusterApi),
        ("api/admin/usage", h.UsageApi),
        ("api/admin/cost", h.CostApi),
        ("api/admin/usage.csv", h.BillingCsv),
        ("api/admin/queues", h.QueuesApi),
        ("api/admin/audit", h.AuditApi),
        ("api/admin/actions/([a-z]+)", h.ActionApi),
        ("api/inventory", h.InventoryApi),
        ("api/me", h.MyRunsApi),
        ("me", h.MyPage),
        ("metrics", h.MetricsHandler),
    ]
    rules: list[tuple[str, type[web.RequestHandler], dict[str, object]] | tuple[str, type[web.RequestHandler]]]
    rules = [(url_path_join(prefix, path) if path else prefix, cls, args) for path, cls in routes]
    rules.append((url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler))
    return web.Application(rules, cookie_secret=os.urandom(32), log_function=log_request)  # type: ignore[arg-type]


def freeze_startup_heap() -> None:
    """Keep what exists once the service has started out of every later garbage collection.

    The service's imports (JupyterHub, tornado, SQLAlchemy, the Kubernetes client) leave about 270,000 objects
    that live as long as the process; a full collection scans them all, about 150 ms of CPU on the benchmark
    machine, which a request then waits for (bench/bench_cost.py saw it as the users page's p95). Frozen, a
    collection scans only what came after (CPython's advice for long-running servers, ``gc.freeze``).
    """
    gc.collect()
    gc.freeze()


async def serve(config: HubConfig, sockets: list[socket.socket]) -> None:
    """Start the watches, serve on ``sockets`` (bound already: the hub's connections wait in their backlog
    meanwhile; none given, the config's port) until SIGTERM/SIGINT, then stop cleanly."""
    store = Store(config.database_url)
    api_client = api_client_from_environment()
    state = HubState(config, api_client, store).start()
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu-offload/")
    app = make_app(state, Operations(config, api_client, store, state.metrics.api_error), prefix)
    host, port = listen_address(config.port)
    server = HTTPServer(app, xheaders=True)
    server.add_sockets(sockets or bind(host, port))
    freeze_startup_heap()
    log.info("gpu-offload service on http://%s:%s%s", host, port, prefix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.stop()
        state.close()
        api_client.close()
