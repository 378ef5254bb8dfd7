"""Queued cells through Kueue on the sandbox: API requests per queued cell, and what waiting costs the kernel.

An origin with one donor of one GPU and the sandbox's Kueue; the pool made by ``gpu-offload queues sync``.
Each measured cell is queued behind a filler pod that holds the GPU, and the bench deletes the filler after
``wait`` seconds, so the cell waits that long in line, then runs ``pass``. Measures, per cell, in steady
state (the kernel's queue watch started, the namespace offloaded, the runner built):

- ``requests``: HTTP requests the sandbox served for the cell from submit until the pod was deleted,
  counted by catch-all fault rules that add no error (as bench_kube.py does), broken down by verb and
  resource; the bench's own filler requests are counted apart and left out;
- ``submit ms``: how long ``backend.submit`` blocks the kernel for a queued cell (no placement; the
  ClusterQueue check; Pod and Secret created) beside the same without queueing (placement from the
  watch-fed inventory);
- ``notice ms``: from the filler's deletion (the GPU frees) until the engine has the "admitted by Kueue"
  event; it includes the emulated Kueue's own cycle, so it bounds the kernel's delay from above.

Usage: .venv/bin/python bench/bench_queue.py [--cells 3] [--waits 5,20,60]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes
from gpu_offload.sandbox.kueue.testing import running_kueue_origin
from gpu_offload.sandbox.liqo import seed as liqo
from harness import Run, Stopwatch, clock  # bench/harness.py: the script's folder is on sys.path
from kube_cells import counted as counted_by

from gpu_offload.cli import main as cli
from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.engine import FollowSettings, Intake, follow
from gpu_offload.engine.errors import OffloadUsageError
from gpu_offload.engine.sinks import RecordingSink

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"
QUEUE = "gpu-offload"
# the first matching rule counts a request; the bench's own (filler reads and deletes) first, then the
# kernel's by kind (the filler's create is subtracted from "POST pods")
CATEGORIES = (
    ("(bench: filler)", r"/pods/fill$", ()),
    ("POST pods", r"/namespaces/[^/]+/pods$", ("POST",)),
    ("GET pods (watch one pod)", r"/namespaces/[^/]+/pods$", ("GET",)),
    ("GET pods/log (follow)", r"/pods/[^/]+/log$", ("GET",)),
    ("GET pod", r"/namespaces/[^/]+/pods/[^/]+$", ("GET",)),
    ("DELETE pod", r"/namespaces/[^/]+/pods/[^/]+$", ("DELETE",)),
    ("POST secrets", r"/namespaces/[^/]+/secrets$", ("POST",)),
    ("GET pendingworkloads (visibility API)", r"/pendingworkloads$", ("GET",)),
    ("GET clusterqueues (list or watch)", r"/clusterqueues$", ("GET",)),
    ("other", r"^/(api|apis)/", ()),
)


class Cell:
    """One ``pass`` cell followed in a thread; records when the engine saw it leave the queue."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend
        self.admitted_at: float | None = None
        self.submit_seconds = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        job, _ = build_job("pass", analyse_cell("pass", {}), {}, self.backend.transfer, request=RunRequest(gpus=1))
        watch = Stopwatch()
        run = self.backend.submit(job)
        self.submit_seconds = watch.seconds
        cell = self

        class Watching(RecordingSink):
            def notice(self, text: str) -> None:
                if text.startswith("admitted by Kueue") and cell.admitted_at is None:
                    cell.admitted_at = clock()
                super().notice(text)

        outcome = follow(run, Watching(), FollowSettings(progress_after=600), Intake(self.backend.trusts))
        run.release(5)
        if outcome.status != "ok":
            raise RuntimeError(f"bench cell ended {outcome.status}: {outcome.error}")


def filler(core: Any, namespace: str) -> None:
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "fill", "labels": {"kueue.x-k8s.io/queue-name": QUEUE,
                                                "kueue.x-k8s.io/priority-class": "interactive"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": "python:3.11-slim", "command": ["python3", "-c", "import time; time.sleep(900)"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    deadline = time.monotonic() + 120
    while core.read_namespaced_pod("fill", namespace).status.phase != "Running":
        if time.monotonic() > deadline:
            raise RuntimeError("the filler never ran")
        time.sleep(0.1)


def queued_cell(backend: KubernetesBackend, core: Any, namespace: str, wait: float) -> tuple[float, float]:
    """One cell queued behind the filler for ``wait`` seconds; (submit seconds, notice seconds)."""
    filler(core, namespace)
    cell = Cell(backend)
    cell.thread.start()
    time.sleep(wait)  # the bench's own clock decides how long the cell waits; nothing is asserted on it
    freed = clock()
    core.delete_namespaced_pod("fill", namespace, grace_period_seconds=0)
    cell.thread.join(300)
    notice = (cell.admitted_at - freed) if cell.admitted_at is not None else float("nan")
    return cell.submit_seconds, notice


def counted(api: Any, cells: int, run: Any) -> dict[str, float]:
    counts = counted_by(api, CATEGORIES, cells, run)
    counts["POST pods"] -= 1  # the bench's filler, created through the same path as the cell's pod
    return counts


def unqueued_submit(client: Any, namespace: str, cells: int) -> list[float]:
    backend = KubernetesBackend(KubeSettings(namespace, user="bench", kernel="bench-direct"), client)
    times = []
    try:
        for _ in range(cells + 1):
            job, _ = build_job("pass", analyse_cell("pass", {}), {}, backend.transfer, request=RunRequest(gpus=1))
            while True:  # the last pod's GPU counts until the inventory's watch saw it go
                watch = Stopwatch()
                try:
                    run = backend.submit(job)
                except OffloadUsageError:
                    time.sleep(0.2)
                    continue
                times.append(watch.seconds)
                break
            follow(run, RecordingSink(), FollowSettings(progress_after=600), Intake(backend.trusts))
            run.release(5)
    finally:
        backend.close()
    return times[1:]  # the first warms the inventory cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=3)
    parser.add_argument("--waits", default="5,20,60")
    args = parser.parse_args()
    waits = [float(w) for w in args.waits.split(",")]
    rows: dict[float, dict[str, float]] = {}
    submits: list[float] = []
    notices: list[float] = []
    donors = (liqo.Donor("donor-1", 1, "A100", "2.00"),)
    with running_kueue_origin(Path(tempfile.mkdtemp(prefix="bench-queue-")), donors=donors,
                              crds=[SHARED / "liqo-crds", SHARED / "kueue-crds"]) as (origin, _):
        os.environ["KUBECONFIG"] = str(origin.sandbox.kubeconfig)
        client = origin.sandbox.api_client()
        core = kubernetes.client.CoreV1Api(client)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace, "labels": {"gpu-offload.io/user-namespace": "true"}}})
        kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(  # as the hub offloads it
            "offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings", {
                "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
                "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "LocalAndRemote"}})
        if cli(["queues", "sync", "--namespace", namespace]) != 0:
            raise RuntimeError("queues sync failed")
        backend = KubernetesBackend(KubeSettings(namespace, user="bench", kernel="bench-kernel", queue=QUEUE,
                                                 priority="interactive"), client)
        try:
            queued_cell(backend, core, namespace, 1.0)  # warm: queue watch, offloading, runner
            for wait in waits:
                def one(wait: float = wait) -> None:
                    submit, notice = queued_cell(backend, core, namespace, wait)
                    submits.append(submit)
                    notices.append(notice)
                rows[wait] = counted(origin.sandbox.api, args.cells, one)
            direct = unqueued_submit(client, namespace, args.cells * len(waits))
        finally:
            backend.close()
            client.close()
    run = Run("queue", "Queued cells through Kueue on the sandbox: API requests per cell and the kernel's wait costs")
    run.note(f"cells per wait: {args.cells}; waits {', '.join(f'{w:g} s' for w in waits)}; goal <= 10 API requests "
             "per queued cell")
    for wait in waits:
        for name, _, _ in CATEGORIES:
            if not name.startswith("(bench"):
                run.figure(f"API requests per queued cell, waits {wait:g} s: {name}", rows[wait][name], "requests")
        total = sum(v for k, v in rows[wait].items() if not k.startswith("(bench"))
        run.goal(f"API requests per queued cell, waits {wait:g} s, total", total, 10, "requests")
        run.figure(f"API requests per queued cell, waits {wait:g} s, total", total, "requests")
    for name, values in (("submit, queued (no placement; ClusterQueue check; Pod + Secret)", submits),
                         ("submit, not queued (placement from the inventory; Pod + Secret)", direct),
                         ("GPU freed -> engine has 'admitted by Kueue' (includes Kueue's cycle)", notices)):
        run.figure(name, [v * 1000 for v in values if not math.isnan(v)], "ms")
    run.write()

if __name__ == "__main__":
    main()
