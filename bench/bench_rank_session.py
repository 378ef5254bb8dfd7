"""Distributed sessions on the kubernetes backend (sandbox): a trivial cell on 2 pods x 1 rank, one-shot (a new
Indexed Job per cell) against a warm distributed session (the same Job's pods, cells through one attachment
per pod), and the API requests each costs.

On an origin with two Liqo donors served in-process, through the official client and the real engine (the
ranks' events merged by ``RankedRun``, as the magic does). ``pass`` from submit until the engine has every
rank's ``done`` and the run is released (for one-shot: the Job deleted). Requests are counted at the sandbox
by catch-all fault rules with no effect (``bench_kube.CATEGORIES`` plus the Job and Service verbs).

Usage: .venv/bin/python bench/bench_rank_session.py [--cells 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import kubernetes
from bench_kube import CATEGORIES, TINY  # the script's folder is on sys.path
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from harness import machine_line, percentile
from harness import origin as origin_of

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.engine import FollowSettings, Intake, follow
from gpu_offload.engine.ranked import RankedRun
from gpu_offload.engine.sinks import RecordingSink

TWO_NODES = Ranks(nodes=2, procs_per_node=1)
JOB_CATEGORIES = (
    ("POST jobs", r"/namespaces/[^/]+/jobs$", ("POST",)),
    ("DELETE job", r"/namespaces/[^/]+/jobs/[^/]+$", ("DELETE",)),
    ("POST services", r"/namespaces/[^/]+/services$", ("POST",)),
    *CATEGORIES,
)


def one_cell(backend: KubernetesBackend, session: str | None = None) -> float:
    cell = "pass"
    start = time.perf_counter()
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, backend.transfer,
                       request=RunRequest(gpus=1, ranks=TWO_NODES), session=session)
    run = RankedRun(backend.submit(job), TWO_NODES, settle=5.0 if session else None)
    outcome = follow(run, RecordingSink(), FollowSettings(progress_after=60), Intake(backend.trusts))
    run.release(5)
    elapsed = time.perf_counter() - start
    if outcome.status != "ok":
        raise RuntimeError(f"bench cell ended {outcome.status}: {outcome.error}")
    return elapsed


def counted(api: Any, cells: int, backend: KubernetesBackend, session: str | None) -> dict[str, float]:
    rules = [(name, api.faults.add(FaultRule(path, methods, delay=TINY))) for name, path, methods in JOB_CATEGORIES]
    try:
        for _ in range(cells):
            one_cell(backend, session)
        return {name: api.faults.fired(rule) / cells for name, rule in rules}
    finally:
        for _, rule in rules:
            api.faults.remove(rule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10)
    args = parser.parse_args()
    with origin_of(2) as origin:
        client = origin.sandbox.api_client()
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": namespace}})
        backend = KubernetesBackend(KubeSettings(namespace, user="bench", kernel="bench-kernel"), client)
        try:
            one_cell(backend)  # warms the inventory cache, offloads the namespace, builds the runner
            one_cell(backend, "warm")
            api = origin.sandbox.api
            oneshot_requests = counted(api, args.cells, backend, None)
            session_requests = counted(api, args.cells, backend, "warm")
            oneshot = [one_cell(backend) for _ in range(args.cells)]
            warm = [one_cell(backend, "warm") for _ in range(args.cells)]
        finally:
            backend.close()
            client.close()
    print(machine_line())
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()[0]:.1f}, "
          f"cells per measure: {args.cells}\n")
    print("| API requests per 2-pod cell (steady state) | one-shot Job | warm distributed session |")
    print("|---|---:|---:|")
    for name, _, _ in JOB_CATEGORIES:
        print(f"| {name} | {oneshot_requests[name]:.2f} | {session_requests[name]:.2f} |")
    print(f"| **total** | **{sum(oneshot_requests.values()):.2f}** | **{sum(session_requests.values()):.2f}** |\n")
    print("| trivial cell (`pass`) on 2 pods x 1 rank, submit to every rank done, released | median ms | p95 ms "
          "| min ms |")
    print("|---|---:|---:|---:|")
    for name, values in (("one-shot Job (cold pods)", oneshot), ("warm distributed session", warm)):
        ms = [v * 1000 for v in values]
        print(f"| {name} | {statistics.median(ms):.0f} | {percentile(ms, 0.95):.0f} | {min(ms):.0f} |")


if __name__ == "__main__":
    main()
