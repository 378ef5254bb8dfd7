"""Distributed cells: launch to first line of a 2 x 2 CPU job, against torchrun (local) or one pod (sandbox).

Local backend (the default): the same script runs both ways, alternating, in one run: as a ``%%gpu_offload
--nodes 2 --procs-per-node 2 --gpus 0`` cell through the engine (job built, two node launchers started, four
ranks, frames decoded) and as ``torchrun --standalone --nproc-per-node 4 script.py`` read from its stdout.
Both times run from the launch to the first line a rank prints after ``init_process_group("gloo")`` (so the
torch import and the rendezvous are in both), and to the end of the run.

``--sandbox``: the kubernetes backend on an in-process sandbox origin with two Liqo donors, alternating in
one run: the same 2 x 2 CPU cell (an Indexed Job of two pods, its Secret and Service, four ranks) against a
one-pod cell (``--gpus 1``; a single cell there needs a GPU) that imports ``torch.distributed`` and prints,
both on the sandbox's torch image. From ``start()`` to the first line, and to the end of the run; between
rounds every pod of the last run is gone.

    .venv/bin/python bench/bench_ranks.py            # 5 rounds
    .venv/bin/python bench/bench_ranks.py --rounds 9
    .venv/bin/python bench/bench_ranks.py --sandbox

Goal (issue 16): launch-to-first-line at most 1.5x torchrun's; the sandbox comparison is reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from harness import Run, Stopwatch
from harness import origin as origin_of  # bench/harness.py: the script's folder is on sys.path

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import Backend
from gpu_offload.engine.backends.local import LocalBackend
from gpu_offload.engine.execution import Launch, start
from gpu_offload.engine.request import OffloadRequest
from gpu_offload.runner.frames import Done, Stream

SCRIPT = """\
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} ready", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
ONE_POD_SCRIPT = """\
import torch.distributed as dist
print("one pod ready", flush=True)
"""
GOAL = 1.5
TORCH_IMAGE = "pytorch/pytorch:2.5"
"""An image name the sandbox runs with torch installed (its ``*pytorch*`` mapping)."""


def ours(backend: Backend, request: OffloadRequest | None = None) -> tuple[float, float]:
    """Seconds from the launch to the first rank's line, and to the run's ``done``."""
    request = request or OffloadRequest(SCRIPT, gpus=0, nodes=2, procs_per_node=2, quiet_ranks=False)
    watch = Stopwatch()
    started = start(request, Launch(analyse_cell(request.cell, {})), {}, backend)
    run = started.run
    first = None
    while True:
        event = run.next_event(1.0)
        if isinstance(event, Stream) and first is None:
            first = watch.seconds
        if isinstance(event, Done):
            assert event.status == "ok", event
            break
    end = watch.seconds
    started.release(10.0)
    assert first is not None
    return first, end


def torchrun(script: Path) -> tuple[float, float]:
    """The same for ``torchrun --standalone --nproc-per-node 4``."""
    beside = Path(sys.executable).with_name("torchrun")
    found = shutil.which("torchrun") or (str(beside) if beside.exists() else None)
    # torchrun is the console script of torch.distributed.run; a venv without the script still has the module
    binary = [found] if found else [sys.executable, "-m", "torch.distributed.run"]
    watch = Stopwatch()
    proc = subprocess.Popen([*binary, "--standalone", "--nproc-per-node", "4", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    first = None
    for line in proc.stdout:
        if first is None and b"ready" in line:
            first = watch.seconds
    code = proc.wait()
    end = watch.seconds
    assert code == 0 and first is not None, code
    return first, end


def local(rounds: int) -> dict[str, list[tuple[float, float]]]:
    """The 2 x 2 cell on the local backend and torchrun, alternating."""
    backend = LocalBackend()
    backend.runner_path()  # built once, as a kernel's first cell would
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ready.py"
        script.write_text(SCRIPT)
        ours(backend), torchrun(script)  # warm the page cache for both
        results: dict[str, list[tuple[float, float]]] = {"gpu_offload 2 x 2": [], "torchrun 1 x 4": []}
        for _ in range(rounds):
            results["gpu_offload 2 x 2"].append(ours(backend))
            results["torchrun 1 x 4"].append(torchrun(script))
    return results


def sandbox(rounds: int) -> dict[str, list[tuple[float, float]]]:
    """The 2 x 2 CPU cell as an Indexed Job and a one-pod cell, alternating, on a sandbox origin."""
    import kubernetes
    from gpu_offload.liqo_peering.specs import runner_selector

    from gpu_offload.engine.backends.kube.backend import KubernetesBackend
    from gpu_offload.engine.backends.kube.config import KubeSettings

    ranked = OffloadRequest(SCRIPT, gpus=0, nodes=2, procs_per_node=2, quiet_ranks=False, image=TORCH_IMAGE,
                            timeout=600)
    one_pod = OffloadRequest(ONE_POD_SCRIPT, gpus=1, image=TORCH_IMAGE, timeout=600)
    with origin_of(2) as origin:
        client = origin.sandbox.api_client()
        core = kubernetes.client.CoreV1Api(client)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        backend = KubernetesBackend(KubeSettings(namespace, user="bench", kernel="bench-kernel"), client)

        def measured(request: OffloadRequest) -> tuple[float, float]:
            result = ours(backend, request)
            # the next round starts on a quiet origin: no pod of this one still stopping
            while core.list_namespaced_pod(namespace, label_selector=runner_selector("bench")).items:
                time.sleep(0.2)
            return result

        try:
            measured(one_pod), measured(ranked)  # inventory cache, offloading, runner, page cache
            results: dict[str, list[tuple[float, float]]] = {"sandbox 2 x 2 (Job, 2 pods)": [],
                                                             "sandbox one pod": []}
            for _ in range(rounds):
                results["sandbox 2 x 2 (Job, 2 pods)"].append(measured(ranked))
                results["sandbox one pod"].append(measured(one_pod))
        finally:
            backend.close()
            client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sandbox", action="store_true",
                        help="the kubernetes backend on a sandbox: 2 x 2 CPU Job against a one-pod cell")
    args = parser.parse_args()
    run = Run("ranks" + ("_sandbox" if args.sandbox else ""),
              "Distributed cells: launch to first line of a 2 x 2 CPU job"
              + (" on the sandbox, against one pod" if args.sandbox else ", against torchrun"),
              script="bench/bench_ranks.py" + (" --sandbox" if args.sandbox else ""))
    results = sandbox(args.rounds) if args.sandbox else local(args.rounds)
    run.note(f"rounds: {args.rounds} (alternating)")
    medians = {}
    for name, runs in results.items():
        firsts = [first for first, _ in runs]
        medians[name] = statistics.median(firsts)
        run.figure(f"{name}: launch to first line", firsts, "s")
        run.figure(f"{name}: launch to end", [end for _, end in runs], "s")
    ours_name, theirs_name = results
    ratio = medians[ours_name] / medians[theirs_name]
    if args.sandbox:
        run.figure("launch to first line, 2 x 2 Job / one pod, medians (reported, no goal)", ratio, "x")
    else:
        run.figure("launch to first line, ours / torchrun, medians", ratio, "x")
        run.goal("launch to first line, ours / torchrun", ratio, GOAL, "x")
    run.write()


if __name__ == "__main__":
    main()
