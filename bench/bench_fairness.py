"""Fairness under contention with queueing on and off, in one run (issue 15's fairness scenario).

The pool is the sandbox's: 2 donors x 2 GPUs, pods really run. User ann submits 40 one-GPU cells at once;
bob and cat submit 4 each a little later (once ann's first cells run). Time is logical
(``gpu_offload.sandbox.kueue.scenario``): every cell holds its GPU until released, and each step releases
the cell that started first, so all cells last the same and the figures do not depend on this machine's
speed. One step is one cell ending; with cells of T seconds on 4 GPUs a step is T/4 seconds.

Three ways to run the same arrivals:
- ``kueue + AFS``: runner-like pods labelled with their user's LocalQueue, one ClusterQueue with
  ``UsageBasedAdmissionFairSharing`` (what ``queueing.kueue.enabled`` sets up);
- ``kueue FIFO``: the same queue without Admission Fair Sharing (BestEffortFIFO alone);
- ``queueing off``: each cell is placed by the project's placement over the live inventory, as a kernel does
  today, one after the other; a cell that finds no free GPU fails (NoFit) and is counted, not retried.

Figures, over the contended period (from bob's and cat's submission until the last of their cells ended
with Kueue + AFS; the same window for every mode): GPU-steps per user and Jain's fairness index of that
split, how busy the pool was, failed cells per user, and the mean wait of bob's and cat's cells in steps;
written as one JSON result (bench/harness.py) with the machine and the date.
Run: ``.venv/bin/python bench/bench_fairness.py``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.errors import NoFit
from gpu_offload.liqo_peering.placement import PlacementRequest, place
from gpu_offload.liqo_peering.trust import TrustPolicy
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kueue import scenario
from gpu_offload.sandbox.kueue.testing import running_kueue_origin
from harness import Run, Stopwatch  # bench/harness.py: the script's folder is on sys.path

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"
USERS = ("ann", "bob", "cat")
HEAVY, LIGHT = 40, 4
DONORS = {"donor-1": 2, "donor-2": 2}
POOL = sum(DONORS.values())
MODES = ("kueue + AFS", "kueue FIFO", "queueing off")


@dataclass
class Outcome:
    mode: str
    pool: scenario.StepPool
    failed: dict[str, int]
    light_done: int
    """The step at which bob's and cat's last cell ended (or failed)."""
    seconds: float


def _names(user: str, count: int) -> list[str]:
    return [f"{user}-{i:02d}" for i in range(count)]


def _placed(client: Any, core: Any, user: str, name: str) -> bool:
    """Place one cell as a kernel does without queueing; False when it fails for want of a GPU."""
    try:
        choice = place(LiqoClient(client, trust=TrustPolicy()).read_inventory(), PlacementRequest(gpus=1))
    except NoFit:
        return False
    body = scenario.held_pod(name, user)
    fragment = choice.scheduling_fragment()
    body["spec"]["containers"][0]["resources"] = fragment["resources"]
    body["spec"].update(tolerations=fragment["tolerations"], affinity=fragment["affinity"])
    core.create_namespaced_pod(user, body)
    # the next cell arrives after this one is bound, so the inventory it reads counts this one
    wait_until(lambda: core.read_namespaced_pod(name, user).spec.node_name, f"{user}/{name} bound")
    return True


def run_mode(mode: str, workdir: Path) -> Outcome:
    crds = [SHARED / "liqo-crds", SHARED / "kueue-crds"]
    clock = Stopwatch()
    with running_kueue_origin(workdir, donors=len(DONORS), gpus=2, crds=crds) as (origin, _):
        client = origin.sandbox.api_client()
        core = kubernetes.client.CoreV1Api(client)
        scenario.user_namespaces(client, USERS)
        queued = mode != "queueing off"
        if queued:
            spec = {"admissionScope": {"admissionMode": "UsageBasedAdmissionFairSharing"}} if "AFS" in mode else {}
            scenario.kueue_pool(client, USERS, DONORS, **spec)
        failed = dict.fromkeys(USERS, 0)

        def submit(user: str, count: int) -> None:
            for name in _names(user, count):
                if queued:
                    core.create_namespaced_pod(user, scenario.held_pod(name, user, scenario.QUEUE))
                elif not _placed(client, core, user, name):
                    failed[user] += 1

        pool = scenario.StepPool(core, size=POOL, timeout=300)
        submit("ann", HEAVY)
        pool.settle((lambda: scenario.workload_count(client, USERS) == HEAVY) if queued else (lambda: True))
        submit("bob", LIGHT)
        submit("cat", LIGHT)
        if queued:
            wait_until(lambda: scenario.workload_count(client, USERS) == HEAVY + 2 * LIGHT, "every Workload", timeout=120)
        light = {(u, n) for u in ("bob", "cat") for n in _names(u, LIGHT)}

        def ended() -> set[tuple[str, str]]:
            return {(h.namespace, h.name) for h in pool.holds if h.ended is not None}
        # with Kueue, until bob's and cat's cells all ran; without, until the pool empties (theirs failed)
        while pool.running() and (not queued or light - ended()):
            pool.release_oldest()
            pool.settle()
        light_done = pool.step if queued else 0
        client.close()
    return Outcome(mode, pool, failed, light_done, clock.seconds)


def record(run: Run, outcome: Outcome, window: int) -> None:
    """One mode's figures over the contended period of ``window`` steps."""
    split = scenario.held(outcome.pool.holds, 0, window)
    values = [split.get(u, 0) for u in USERS]
    mode = outcome.mode
    for user, value in zip(USERS, values, strict=True):
        run.figure(f"{mode}: GPU-steps of {user}", value, "steps", lower_is_better=False)
    run.figure(f"{mode}: Jain's index of the split", scenario.jain(values), "index", lower_is_better=False)
    run.figure(f"{mode}: pool busy", 100 * sum(values) / (POOL * window) if window else 0.0, "%",
               lower_is_better=False)
    for user in USERS:
        run.figure(f"{mode}: failed cells of {user}", outcome.failed[user], "cells")
    waits = [h.started for h in outcome.pool.holds if h.user in ("bob", "cat")]
    if waits:
        run.figure(f"{mode}: bob and cat mean wait", statistics.mean(waits), "steps")
    run.figure(f"{mode}: wall time", outcome.seconds, "s")


def main() -> None:
    run = Run("fairness", "Fairness under contention: Kueue with and without Admission Fair Sharing, and no queueing")
    outcomes = []
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix="bench-fair-") as tmp:
            outcomes.append(run_mode(mode, Path(tmp)))
    # kueue FIFO ran until bob's and cat's cells were done too; its window is its own (longer) period
    window = outcomes[0].light_done
    run.note(f"ann {HEAVY} cells at once, bob and cat {LIGHT} each a little later; pool {POOL} GPUs; contended "
             f"period {window} steps (Kueue + AFS: bob's and cat's arrival to their last cell's end; kueue FIFO "
             "over its own period)")
    for outcome in outcomes:
        record(run, outcome, outcome.light_done if outcome.mode == "kueue FIFO" else window)
    run.write()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
