"""A one-GPU cell on the real cluster beside the sandbox, in one run: how long from Shift-Enter to the cell's first
line, what a warm session adds, how many API requests a cell costs, and where the wait goes.

Both clusters get the same two Liqo donors (on the real cluster the seeded objects of tests/realcluster, each
donor a real kubelet's node with containerd, runc and the fake GPU plugin; images already on the nodes) and the
same kernel code, driven as the magic drives it (``engine.execution.run_blocking`` with a ``Stopwatch`` started
before the cell's analysis, so the marks are ``engine/timing.py``'s phases):

- one-shot ``print``: Shift-Enter to the first line and to done, and each phase's share;
- one-shot ``import torch`` (``--torch``): the sandbox's torch venv against tests/realcluster/torch_image.sh's
  image on donor-1's node (pinned there: only that node holds it); the cell starts with ``import torch``, so
  its runner imports torch while the kernel attaches (``--preimport``); its peer, alternating with it in the
  same run, is the same cell after one statement of its own (``started = 0``), which the runner does not
  import ahead (the import waits for the bundle, as every cell's did before);
- warm session ``print``: Shift-Enter to the first line and to done (the session's pod already runs);
- API requests per cell, as each server saw them: the sandbox counts at its own API server (catch-all fault
  rules without effect, as bench_kube.py does); the real API server's audit log (up.sh logs the admin's requests)
  is filtered by this benchmark's client user agent (and, for the websocket requests that carry none, by its
  namespace).

Goals (issue 29 item 3, the real cluster): one-shot launch to first line <= 3 s median without torch and <= 5 s
with it; warm session <= 50 ms from Shift-Enter to the first line.

Usage (root; the real cluster up): sudo bash tests/realcluster/up.sh && sudo bash tests/realcluster/torch_image.sh
    .venv/bin/python bench/bench_realcluster.py [--cells 10] [--torch]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
from bench_kube import CATEGORIES  # bench/ is on sys.path: the sandbox's request categories
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from gpu_offload.sandbox.liqo import seed as liqo
from harness import LIQO_CRDS, REPO, Run
from harness import origin as sandbox_origin
from kube_cells import TINY

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.engine import FollowSettings
from gpu_offload.engine.execution import Launch, run_blocking
from gpu_offload.engine.request import OffloadRequest
from gpu_offload.engine.sinks import RecordingSink
from gpu_offload.engine.timing import RunTiming, Stopwatch

sys.path.insert(0, str(REPO))
from tests.realcluster import realorigin  # noqa: E402 - the real cluster's seeded origin, as its tests use it

DONORS = (liqo.Donor("donor-1", 4, "A100", "2.00"), liqo.Donor("donor-2", 8, "L4", "0.80"))
STOCK = "python:3.11-slim"  # Debian's python3 on the real nodes; the sandbox's stock venv
CELL = "print('first line')"
TORCH_CELL = "import torch\nprint('torch', torch.__version__)"
TORCH_LATE_CELL = "started = 0\nimport torch\nprint('torch', torch.__version__)"  # not imported ahead
TORCH_IMAGES = {"sandbox": "pytorch/pytorch:2.13.0", "real": "localhost/gpuorc/python-torch:3.11"}
AGENT = "gpu-offload-bench/realcluster"
AUDIT = realorigin.STATE / "logs" / "audit.log"
METHODS = {"create": "POST", "delete": "DELETE", "deletecollection": "DELETE", "get": "GET", "list": "GET",
           "watch": "GET", "patch": "PATCH", "update": "PUT"}
GOALS = {"one-shot": 3000.0, "torch": 5000.0, "warm": 50.0}


def timed_cell(backend: KubernetesBackend, cell: str, **request: Any) -> RunTiming:
    """One cell as the magic runs it; its phases from Shift-Enter."""
    clock = Stopwatch()
    analysis = analyse_cell(cell, {})
    clock.mark("analysis")
    outcome = run_blocking(OffloadRequest(cell, gpus=1, **request), Launch(analysis, clock=clock), {}, backend,
                           RecordingSink(), FollowSettings(progress_after=600))
    if outcome.status != "ok" or outcome.timing is None:
        raise RuntimeError(f"bench cell ended {outcome.status}: {outcome.error}")
    return outcome.timing


@contextlib.contextmanager
def sandbox_counter(origin: Any, _: str) -> Iterator[Callable[[], Counter[str]]]:
    """Requests the sandbox's API server serves inside the block, by category."""
    api = origin.sandbox.api
    rules = [(name, api.faults.add(FaultRule(path, methods, delay=TINY))) for name, path, methods in CATEGORIES]
    try:
        yield lambda: Counter({name: api.faults.fired(rule) for name, rule in rules})
    finally:
        for _, rule in rules:
            api.faults.remove(rule)


@contextlib.contextmanager
def audit_counter(_: Any, namespace: str) -> Iterator[Callable[[], Counter[str]]]:
    """Requests of this benchmark's client the real API server logged inside the block, by category: those with
    its user agent, and those on its namespace without one (the client's websocket, attach, sends none)."""
    start = AUDIT.stat().st_size if AUDIT.exists() else 0

    def count() -> Counter[str]:
        seen: dict[str, str] = {}
        with AUDIT.open() as log:
            log.seek(start)
            for line in log:
                event = json.loads(line)
                agent, where = event.get("userAgent"), (event.get("objectRef") or {}).get("namespace")
                if agent == AGENT or (agent is None and where == namespace):  # a watch is logged twice: one id
                    seen[event["auditID"]] = category(METHODS.get(event["verb"], event["verb"]),
                                                      event["requestURI"].partition("?")[0])
        return Counter(seen.values())
    yield count


def category(method: str, path: str) -> str:
    """The first of bench_kube's categories a request falls in."""
    for name, pattern, methods in CATEGORIES:
        if re.search(pattern, path) and (not methods or method in methods):
            return name
    return "other"


@contextlib.contextmanager
def cluster(name: str) -> Iterator[tuple[Any, Any]]:
    """The origin of ``name`` (sandbox or real) with DONORS, and an API client carrying the bench's agent."""
    with (sandbox_origin(DONORS) if name == "sandbox" else realorigin.seeded_origin(DONORS, LIQO_CRDS)) as origin:
        client = origin.sandbox.api_client()
        client.user_agent = AGENT
        try:
            yield origin, client
        finally:
            client.close()


def measure(name: str, run: Run, cells: int, torch: bool) -> dict[str, list[float]]:
    """Every figure of one cluster; returns its medians' samples by measure for the side-by-side notes."""
    samples: dict[str, list[float]] = {}
    with cluster(name) as (origin, client):
        namespace = f"t-bench-{uuid.uuid4().hex[:6]}"
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": namespace}})
        backend = KubernetesBackend(KubeSettings(namespace, image=STOCK, user="bench", kernel="bench-kernel"), client)
        counter = sandbox_counter if name == "sandbox" else audit_counter
        try:
            timed_cell(backend, CELL)  # warms the inventory cache, offloads the namespace, builds the runner
            timed_cell(backend, CELL, session="warm")
            for label, session in (("one-shot", None), ("warm session", "warm")):
                with counter(origin, namespace) as count:
                    timings = [timed_cell(backend, CELL, session=session) for _ in range(cells)]
                    requests = count()
                for key in sorted(requests):
                    run.figure(f"{name}: API requests per {label} cell: {key}", requests[key] / cells, "requests")
                run.figure(f"{name}: API requests per {label} cell, total", sum(requests.values()) / cells, "requests")
                samples[label] = record(run, f"{name}: {label} cell", timings)
            if torch:
                image = TORCH_IMAGES[name]
                timed_cell(backend, TORCH_CELL, image=image, cluster="donor-1")  # the first start pays page-ins
                ahead: list[RunTiming] = []
                late: list[RunTiming] = []
                for _ in range(cells):  # alternating: a load spike hits both
                    ahead.append(timed_cell(backend, TORCH_CELL, image=image, cluster="donor-1"))
                    late.append(timed_cell(backend, TORCH_LATE_CELL, image=image, cluster="donor-1"))
                samples["torch"] = record(run, f"{name}: one-shot `import torch` cell", ahead)
                samples["torch, not ahead"] = record(run, f"{name}: one-shot `import torch` after a statement "
                                                           "(not imported ahead)", late)
        finally:
            backend.close()
    return samples


def record(run: Run, label: str, timings: list[RunTiming]) -> list[float]:
    """Launch to first line and to done, and each phase's duration, as figures; returns the first-line samples."""
    first = [1000 * (t.at("first line") or 0.0) for t in timings]
    run.figure(f"{label}, Shift-Enter to first line", first, "ms")
    run.figure(f"{label}, Shift-Enter to done", [1000 * (t.at("done") or 0.0) for t in timings], "ms")
    steps: dict[str, list[float]] = {}
    for timing in timings:
        for phase, took in timing.steps():
            steps.setdefault(phase, []).append(1000 * took)
    for phase, values in steps.items():
        run.figure(f"{label}, phase {phase}", values, "ms")
    boots = [1000 * t.runner_boot for t in timings if t.runner_boot is not None]
    if boots:
        run.figure(f"{label}, runner boot (its process start to hello)", boots, "ms")
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10, help="cells per measure (default 10)")
    parser.add_argument("--torch", action="store_true", help="also an `import torch` cell (torch_image.sh first)")
    args = parser.parse_args()
    run = Run("realcluster", "A one-GPU cell on the real cluster beside the sandbox")
    found = {name: measure(name, run, args.cells, args.torch) for name in ("sandbox", "real")}
    run.note(f"cells per measure: {args.cells}; both clusters in this run, sandbox first")
    for measure_name, goal_key in (("one-shot", "one-shot"), ("warm session", "warm"), ("torch", "torch"),
                                   ("torch, not ahead", "torch")):
        if measure_name not in found["real"]:
            continue
        real, sandbox = statistics.median(found["real"][measure_name]), statistics.median(found["sandbox"][measure_name])
        goal = GOALS[goal_key]
        run.note(f"{measure_name}: Shift-Enter to first line, median: real {real:.0f} ms, sandbox {sandbox:.0f} ms "
                 f"({real / sandbox:.2f}x); goal on the real cluster <= {goal:.0f} ms: "
                 f"{'met' if real <= goal else 'NOT met'}")
    run.write()


if __name__ == "__main__":
    main()
