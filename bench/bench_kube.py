"""The kubernetes backend on the sandbox: API requests per offloaded cell, and a trivial cell's overhead.

Three measures, on an origin with two Liqo donors served in-process, through the official client:

- ``requests per cell``: HTTP requests the sandbox served per one-shot cell (and per session cell) once the
  inventory cache is warm and the namespace is offloaded, counted at the sandbox by catch-all fault rules
  that add no error and a negligible delay (``api.faults``), broken down by verb and resource;
- ``trivial cell, one-shot``: ``pass`` from submit until the engine has the ``done`` frame and the pod is
  deleted (a new pod each time: Secret, scheduling, process start, log follow);
- ``trivial cell, warm session``: the same in a session pod (command through attach, frames through the
  session's log follow).

Usage: .venv/bin/python bench/bench_kube.py [--cells 20]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import kubernetes
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from harness import Run  # bench/harness.py: the script's folder is on sys.path
from harness import origin as origin_of

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.engine import FollowSettings, Intake, follow
from gpu_offload.engine.sinks import RecordingSink

# Counted in this order (the first matching rule counts a request); the last one catches the rest.
CATEGORIES = (
    ("POST pods", r"/namespaces/[^/]+/pods$", ("POST",)),
    ("GET pods (watch one pod)", r"/namespaces/[^/]+/pods$", ("GET",)),
    ("GET pods/log (follow)", r"/pods/[^/]+/log$", ("GET",)),
    ("GET pods/attach", r"/pods/[^/]+/attach$", ()),
    ("GET pod", r"/namespaces/[^/]+/pods/[^/]+$", ("GET",)),
    ("DELETE pod", r"/namespaces/[^/]+/pods/[^/]+$", ("DELETE",)),
    ("POST secrets", r"/namespaces/[^/]+/secrets$", ("POST",)),
    ("other", r"^/(api|apis)/", ()),
)
TINY = 1e-9  # a rule needs an effect; this delay is below the timer's resolution


def one_cell(backend: KubernetesBackend, session: str | None = None) -> float:
    cell = "pass"
    start = time.perf_counter()
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, backend.transfer, request=RunRequest(gpus=1),
                       session=session)
    run = backend.submit(job)
    outcome = follow(run, RecordingSink(), FollowSettings(progress_after=60), Intake(backend.trusts))
    run.release(5)
    elapsed = time.perf_counter() - start
    if outcome.status != "ok":
        raise RuntimeError(f"bench cell ended {outcome.status}: {outcome.error}")
    return elapsed


def counted(api: Any, cells: int, backend: KubernetesBackend, session: str | None) -> dict[str, float]:
    rules = [(name, api.faults.add(FaultRule(path, methods, delay=TINY))) for name, path, methods in CATEGORIES]
    try:
        for _ in range(cells):
            one_cell(backend, session)
        # read before removing: a removed rule no longer has a count
        return {name: api.faults.fired(rule) / cells for name, rule in rules}
    finally:
        for _, rule in rules:
            api.faults.remove(rule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=20)
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
    run = Run("kube", "Kubernetes backend on the sandbox")
    run.note(f"cells per measure: {args.cells}; goal: <= 8 API requests per one-shot cell")
    for name, _, _ in CATEGORIES:
        run.figure(f"API requests per one-shot cell: {name}", oneshot_requests[name], "requests")
        run.figure(f"API requests per warm-session cell: {name}", session_requests[name], "requests")
    run.figure("API requests per one-shot cell, total", sum(oneshot_requests.values()), "requests")
    run.figure("API requests per warm-session cell, total", sum(session_requests.values()), "requests")
    for name, values in (("one-shot pod (cold)", oneshot), ("warm session pod", warm)):
        run.figure(f"trivial cell (`pass`), {name}, submit to done", [v * 1000 for v in values], "ms")
    run.write()

if __name__ == "__main__":
    main()
