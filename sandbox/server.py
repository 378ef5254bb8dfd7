"""The sandbox API server: an aiohttp app over :class:`Api`, run on its own loop (in a thread or not).

Extension points (part 2):

- ``ApiServer(plugins=[...])``: each plugin is called as ``plugin(server)`` before start; it registers
  admission hooks, stream providers and faults on ``server.api``, controllers with
  ``server.add_controller`` and extra HTTP routes on ``server.app.router`` (e.g. a fault control endpoint
  under ``/sandbox/``).
- Controllers are coroutine functions ``async def controller(api: Api) -> None``, run as asyncio tasks on
  the server's loop from ``start()`` and cancelled on ``stop()``; they use ``api`` (synchronous,
  thread-safe) and ``api.store.subscribe(...)`` for changes. One that crashes is logged and not restarted.
- From another thread, ``server.call(coro)`` runs a coroutine on the server's loop and returns its result.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from aiohttp import web

from .apiserver import discovery, openapi, podsecurity, quota
from .apiserver.api import Api
from .apiserver.errors import NOT_FOUND, ApiError
from .apiserver.http_api import json_response, resource_handler
from .controllers.disruption import disruption_controller
from .controllers.jobs import indexed_completions_rule, job_controller, restart_policy_rule

log = logging.getLogger(__name__)
T = TypeVar("T")
Controller = Callable[[Api], Awaitable[None]]
Plugin = Callable[["ApiServer"], None]




@web.middleware
async def _status_errors(request: web.Request, handler: Callable[..., Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return json_response(exc.status(), exc.code, headers)


async def _unknown_path(request: web.Request) -> web.Response:
    raise ApiError(404, "NotFound", NOT_FOUND)


def _discovery_routes(app: web.Application, api: Api) -> None:
    reg = api.registry

    def not_found() -> ApiError:  # kube-apiserver's words, not the path: clients match on them
        return ApiError(404, "NotFound", NOT_FOUND)

    async def version(_: web.Request) -> web.Response:
        return json_response(discovery.KUBE_VERSION)

    async def core(_: web.Request) -> web.Response:
        return json_response(discovery.core_versions())

    async def core_v1(_: web.Request) -> web.Response:
        return json_response(discovery.resource_list(reg, "", "v1"))

    async def groups(_: web.Request) -> web.Response:
        return json_response(discovery.group_list(reg))

    async def group(request: web.Request) -> web.Response:
        doc = discovery.group(reg, request.match_info["group"])
        if doc is None:
            raise not_found()
        return json_response(doc)

    async def group_version(request: web.Request) -> web.Response:
        doc = discovery.resource_list(reg, request.match_info["group"], request.match_info["version"])
        if doc is None:
            raise not_found()
        return json_response(doc)

    async def healthy(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def openapi_root(_: web.Request) -> web.Response:
        return json_response(openapi.root(reg))

    async def openapi_gv(request: web.Request) -> web.Response:
        doc = openapi.group_version(reg, request.match_info["gv"].strip("/"))
        if doc is None:
            raise not_found()
        return json_response(doc)

    app.router.add_get("/version", version)
    app.router.add_get("/openapi/v3", openapi_root)
    app.router.add_get("/openapi/v3/{gv:.+}", openapi_gv)
    for probe in ("/healthz", "/readyz", "/livez"):
        app.router.add_get(probe, healthy)
    # clients ask with and without a trailing slash (the generated ApisApi uses "/apis/")
    for path, handler in (("/api", core), ("/api/v1", core_v1), ("/apis", groups), ("/apis/{group}", group),
                          ("/apis/{group}/{version}", group_version)):
        app.router.add_get(path, handler)
        app.router.add_get(path + "/", handler)


class ApiServer:
    """The HTTP server of one emulated cluster, on 127.0.0.1."""

    def __init__(self, api: Api | None = None, host: str = "127.0.0.1", port: int = 0,
                 plugins: Iterable[Plugin] = ()) -> None:
        self.api = api or Api()
        self.host, self.port = host, port
        self.app = web.Application(middlewares=[self.api.faults.middleware(), _status_errors],
                                   client_max_size=64 * 1024 * 1024)
        _discovery_routes(self.app, self.api)
        self._plugins = list(plugins)
        self.api.admission.add_validating("jobs.batch", restart_policy_rule)
        self.api.admission.add_validating("jobs.batch", indexed_completions_rule)
        podsecurity.install(self.api)  # before quota: kube-apiserver's PodSecurity runs before ResourceQuota
        quota.install(self.api)
        self._controllers: list[Controller] = [job_controller, disruption_controller]
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        for plugin in self._plugins:
            plugin(self)
        # after the plugins, so that an aggregated API a plugin serves (Kueue's visibility) wins over these
        self.app.router.add_route("*", "/api/v1/{tail:.*}", resource_handler(self.api, core=True))
        self.app.router.add_route("*", "/apis/{group}/{version}/{tail:.*}", resource_handler(self.api, core=False))
        # last, so that plugin routes win: anything unknown is a 404 Status, as clients expect JSON
        self.app.router.add_route("*", "/{tail:.*}", _unknown_path)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` once started."""
        return f"http://{self.host}:{self.port}"

    def serve_socket(self, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
        """Serve the API on this bound, listening socket too (the TLS endpoint for pods), from ``start``."""
        self._sockets.append((sock, ssl_context))

    def add_controller(self, controller: Controller) -> None:
        """Run ``controller(api)`` as a task on the server's loop (now, if already started)."""
        self._controllers.append(controller)
        if self.loop is not None and self._runner is not None:
            self.loop.call_soon_threadsafe(self._spawn, controller)

    def _spawn(self, controller: Controller) -> None:
        task = asyncio.get_running_loop().create_task(self._guard(controller))
        self._tasks.append(task)

    async def _guard(self, controller: Controller) -> None:
        try:
            await controller(self.api)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sandbox controller %s crashed and will not restart", controller.__name__)

    async def start(self) -> None:
        """Bind the port (an ephemeral one if 0), serve, and start the controllers."""
        # An audit event, so a test session can tell which tests start an API server (the fast lane may not).
        sys.audit("gpu_offload.sandbox.start", self.host, self.port)
        self.loop = asyncio.get_running_loop()
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:  # port 0: learn which port the OS picked
            self.port = sockets[0].getsockname()[1]
        for sock, context in self._sockets:
            await web.SockSite(self._runner, sock, ssl_context=context).start()
        for controller in self._controllers:
            self._spawn(controller)

    async def stop(self) -> None:
        """Cancel the controllers and close every connection."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start_in_thread(self) -> ApiServer:
        """Start on a fresh loop in a daemon thread; returns once the port answers."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # handed to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="sandbox-api", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise RuntimeError(f"the sandbox API server could not start on {self.host}:{self.port}") from failure[0]
        return self

    def stop_thread(self) -> None:
        """Stop a server started with ``start_in_thread`` and wait for its thread."""
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
            self._thread = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the server's loop from another thread and return its result."""
        if self.loop is None:
            raise RuntimeError("the sandbox server is not running: start it first")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
