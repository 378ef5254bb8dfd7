"""What the kubernetes-backend benchmarks share: a trivial cell from submit to release, the API requests a
cell costs (counted at the sandbox by catch-all fault rules with no effect), and the measuring loop on an
origin with two donors (``bench_kube``, ``bench_rank_session``)."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from harness import Run as Results  # bench/harness.py: the script's folder is on sys.path
from harness import Stopwatch
from harness import origin as origin_of

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import Run, RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.engine import FollowSettings, Intake, follow
from gpu_offload.engine.sinks import RecordingSink

Category = tuple[str, str, Sequence[str]]
"""A name, a path pattern and the methods it counts (none: every method)."""
TINY = 1e-9  # a rule needs an effect; this delay is below the timer's resolution
OneCell = Callable[[KubernetesBackend, "str | None"], float]


def trivial_cell(backend: KubernetesBackend, request: RunRequest, session: str | None = None,
                 wrap: Callable[[Run], Run] = lambda run: run) -> float:
    """Seconds from building the job of ``pass`` until the engine has its ``done`` and the run is released;
    ``wrap``: what the front end puts around the backend's run (``RankedRun`` for a distributed one)."""
    cell = "pass"
    watch = Stopwatch()
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, backend.transfer, request=request, session=session)
    run = wrap(backend.submit(job))
    outcome = follow(run, RecordingSink(), FollowSettings(progress_after=60), Intake(backend.trusts))
    run.release(5)
    elapsed = watch.seconds
    if outcome.status != "ok":
        raise RuntimeError(f"bench cell ended {outcome.status}: {outcome.error}")
    return elapsed


def counted(api: Any, categories: Sequence[Category], cells: int, one: Callable[[], float]) -> dict[str, float]:
    """API requests per cell by category, over ``cells`` runs of ``one`` (the first matching rule counts)."""
    rules = [(name, api.faults.add(FaultRule(path, methods, delay=TINY))) for name, path, methods in categories]
    try:
        for _ in range(cells):
            one()
        # read before removing: a removed rule no longer has a count
        return {name: api.faults.fired(rule) / cells for name, rule in rules}
    finally:
        for _, rule in rules:
            api.faults.remove(rule)


@dataclass(frozen=True)
class Measured:
    """Requests per cell and seconds per cell, one-shot and in a warm session ``warm``."""

    oneshot_requests: dict[str, float]
    session_requests: dict[str, float]
    oneshot: list[float]
    warm: list[float]

    def record(self, run: Results, categories: Sequence[Category], per: tuple[str, str], timed: str,
               kinds: tuple[str, str]) -> None:
        """Into ``run``: the requests per cell by category and in all, named ``API requests per <per>: <category>``
        (one-shot, then warm), and the cells' milliseconds, named ``timed`` with each of ``kinds`` put in."""
        counts = (self.oneshot_requests, self.session_requests)
        for name, _, _ in categories:
            for cell, count in zip(per, counts, strict=True):
                run.figure(f"API requests per {cell}: {name}", count[name], "requests")
        for cell, count in zip(per, counts, strict=True):
            run.figure(f"API requests per {cell}, total", sum(count.values()), "requests")
        for kind, values in zip(kinds, (self.oneshot, self.warm), strict=True):
            run.figure(timed.format(kind), [v * 1000 for v in values], "ms")


def measured_from_command_line(doc: str | None, cells: int, categories: Sequence[Category],
                               one_cell: OneCell) -> tuple[Measured, int]:
    """``--cells N`` (default ``cells``) from the command line, then :func:`measure`; returns the figures and N."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=cells)
    count = parser.parse_args().cells
    return measure(categories, count, one_cell), count


def measure(categories: Sequence[Category], cells: int, one_cell: OneCell) -> Measured:
    """On a new origin with two donors and a new namespace: warm up (the inventory cache, the namespace's
    offloading, the runner, the session ``warm``), then count requests and time ``cells`` cells of each kind."""
    with origin_of(2) as origin:
        client = origin.sandbox.api_client()
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": namespace}})
        backend = KubernetesBackend(KubeSettings(namespace, user="bench", kernel="bench-kernel"), client)
        try:
            one_cell(backend, None)
            one_cell(backend, "warm")
            api = origin.sandbox.api
            return Measured(
                counted(api, categories, cells, lambda: one_cell(backend, None)),
                counted(api, categories, cells, lambda: one_cell(backend, "warm")),
                [one_cell(backend, None) for _ in range(cells)],
                [one_cell(backend, "warm") for _ in range(cells)],
            )
        finally:
            backend.close()
            client.close()
