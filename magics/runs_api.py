"""A jupyter-server extension: the user's offloaded runs over REST, for every kernel of this server.

``GET {base_url}gpu-offload/runs`` lists the runs (the state directory every kernel writes, plus the runner
pods labelled with the user in the user's namespace when a cluster is configured);
``POST {base_url}gpu-offload/runs/<run_id>/cancel`` stops one as Ctrl-C would (the owning kernel is asked
through the state directory; a pod whose kernel is gone is deleted). It also sweeps: the runner pods of
kernels this server no longer has are deleted (``UserRuns.sweep``; the kubernetes backend's is
``backends/kube/sweep.py``). It reads and stops runs only through the backends' ``UserRuns`` interface. Enable it with
``jupyter server --ServerApp.jpserver_extensions="{'gpu_offload.magics.runs_api': True}"`` (or the
``jupyter_server_config.d`` file of the package).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..engine.backends import registry
from ..engine.backends.base import UserRuns
from ..engine.runs.listing import cancel_elsewhere, list_runs
from ..engine.runs.records import RunBook, record_to_json
from ..liqo_peering import environment as E
from ..liqo_peering.settings import KernelSettings, read_kernel

RUN_ID = r"(?P<run_id>[A-Za-z0-9][A-Za-z0-9_.-]{0,62})"


class RunsContext:
    """Where the runs come from: the state directory and, when configured, the user's runner pods."""

    def __init__(self, book: RunBook, runs: UserRuns | None, problem: str = "") -> None:
        self.book, self.runs = book, runs
        self.problem = problem
        """Why the cluster's pods are not listed (shown with every answer), empty when they are."""

    @classmethod
    def from_environment(cls) -> RunsContext:
        """The server's own environment decides (a hub sets the namespace for the user's server)."""
        try:
            return cls(RunBook(), registry.user_runs(os.environ))
        except Exception as exc:  # noqa: BLE001 - the state directory still answers; the reason is shown
            return cls(RunBook(), None, f"runner pods are not listed: the cluster is unreachable ({exc}); "
                                              "check KUBECONFIG and GPU_OFFLOAD_NAMESPACE and restart the server")


class _Base(APIHandler):
    @property
    def runs_context(self) -> RunsContext:
        return self.settings["gpu_offload_runs"]  # type: ignore[no-any-return]


class RunsHandler(_Base):
    """``GET``: the user's runs, newest first."""

    @web.authenticated
    def get(self) -> None:
        ctx = self.runs_context
        listing = list_runs((), ctx.book, ctx.runs)
        problems = [*([ctx.problem] if ctx.problem else []), *listing.problems]
        self.finish(json.dumps({"runs": [record_to_json(r) for r in listing.runs], "problems": problems}))


class CancelHandler(_Base):
    """``POST``: stop one run."""

    @web.authenticated
    def post(self, run_id: str) -> None:
        ctx = self.runs_context
        listing = list_runs((), ctx.book, ctx.runs)
        record = next((r for r in listing.runs if r.run_id == run_id), None)
        if record is None:
            self.set_status(404)
            self.finish(json.dumps({"message": f"No run {run_id} of yours is known here: GET gpu-offload/runs "
                                               "lists the runs this server sees."}))
            return
        said = cancel_elsewhere(record, ctx.book, ctx.runs)
        self.set_status(200 if record.finished else 202)
        self.finish(json.dumps({"message": said, "run": record_to_json(record)}))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpu_offload.magics.runs_api"}]


def _start_sweep(serverapp: Any, ctx: RunsContext) -> None:
    """Delete, now and every ``GPU_OFFLOAD_SWEEP_SECONDS`` (0: never), the runner pods of this server's dead
    kernels. The server's id goes into its own environment first, so the kernels it starts label their pods."""
    import asyncio

    from tornado.ioloop import PeriodicCallback

    env = os.environ
    settings = read_kernel(env)
    period, problem = sweep_period(settings)
    if problem:
        serverapp.log.warning("gpu-offload: %s", problem)
    runs = ctx.runs
    if runs is None or period <= 0:
        return
    server = settings.server_id or server_identity(env)
    env[E.SERVER_ID.name] = server  # the kernels this server starts inherit it
    running: list[asyncio.Future[Any]] = []

    def sweep() -> list[str]:
        return runs.sweep(server, lambda: _live_kernels(serverapp))

    def tick() -> None:
        if running and not running[0].done():
            return  # a slow API server: one sweep at a time
        running[:] = [asyncio.get_running_loop().run_in_executor(None, _sweep_once, sweep, serverapp.log)]

    def begin() -> None:  # on the running loop: the first sweep now, then periodically
        callback = PeriodicCallback(tick, period * 1000)
        callback.start()
        serverapp.web_app.settings["gpu_offload_sweep"] = callback
        tick()

    serverapp.io_loop.add_callback(begin)


def server_identity(env: Mapping[str, str]) -> str:
    """This server's label value on its kernels' runner pods: stable across restarts in a hub (its user and
    server name are), so a restarted server also sweeps what its previous life left; host and pid elsewhere."""
    if env.get("JUPYTERHUB_USER"):
        return f"hub-{env.get('JUPYTERHUB_SERVER_NAME') or 'default'}"
    return f"{socket.gethostname()}-{os.getpid()}"


def sweep_period(settings: KernelSettings) -> tuple[float, str]:
    """Seconds between sweeps from ``GPU_OFFLOAD_SWEEP_SECONDS``, and what was wrong with it (empty if fine)."""
    problem = settings.problem("sweep_seconds")
    if problem:
        return settings.sweep_seconds, (f"{problem}; sweeping every {settings.sweep_seconds:g} s. Set it like 60, "
                                        "or 0 to turn the sweep off.")
    return settings.sweep_seconds, ""


def _live_kernels(serverapp: Any) -> dict[str, int | None]:
    """This server's kernels and their process ids (None where the provisioner has none, e.g. mid-restart)."""
    manager = serverapp.kernel_manager
    live: dict[str, int | None] = {}
    for kernel_id in manager.list_kernel_ids():
        try:
            pid = manager.get_kernel(kernel_id).provisioner.pid
        except (KeyError, AttributeError):  # gone since listed, or a remote provisioner without a pid
            pid = None
        live[kernel_id] = pid if isinstance(pid, int) else None
    return live


def _sweep_once(sweep: Any, log: Any) -> None:
    try:
        removed = sweep()
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster must not stop the server; next tick retries
        log.warning("gpu-offload: sweeping the runner pods of ended kernels failed: %s", exc)
        return
    if removed:
        log.info("gpu-offload: removed what ended kernels left running: %s", ", ".join(removed))


def _load_jupyter_server_extension(serverapp: Any) -> None:
    web_app = serverapp.web_app
    base = url_path_join(web_app.settings["base_url"], "gpu-offload", "runs")
    context = RunsContext.from_environment()
    web_app.settings["gpu_offload_runs"] = context
    _start_sweep(serverapp, context)
    web_app.add_handlers(".*$", [
        (base, RunsHandler),
        (url_path_join(base, RUN_ID, "cancel"), CancelHandler),
    ])
