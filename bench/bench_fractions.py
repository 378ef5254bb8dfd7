"""Fractions of GPUs packed onto a production pool: unallocated GPUs and tasks started per packing policy.

The Alibaba cluster-trace-gpu-v2023 (Weng et al., "Beware of Fragmentation", USENIX ATC '23) is read from
../shared/traces/alibaba-gpu-v2023/, never copied here: 1,213 GPU nodes and task lists whose GPU tasks ask for
a share of one GPU (``gpu_milli`` < 1000) or whole GPUs, with CPU, memory and allowed models.

As in the paper's evaluation, tasks arrive in trace order (the list repeated when it runs out) and never
leave, until the GPUs asked for reach 130% of the pool; a task that fits nowhere is refused and the next one
comes. Reported per policy and workload, side by side in one run: the share of the pool's GPU capacity left
unallocated when the demand reached 90%, 100% and 110% of it (lower is better: capacity that was free but
that no arriving task could use), and the tasks started by then. The nodes are dealt round-robin to six donor
clusters; the first three are trusted, so the project's tie-break on trust has something to choose.

``fgd`` is given the workload's own request mix up front (the paper's oracle); ``project`` learns it from
the requests it has seen (the last 2,000), as a deployment has to.

Run: ``.venv/bin/python bench/bench_fractions.py [--workloads default,gpushare100]``.
"""

from __future__ import annotations

import argparse
import sys

import alibaba_trace  # bench/: the script's folder is on sys.path
from gpu_offload.liqo_peering.packing import (
    BestFit,
    Demand,
    Fgd,
    GpuNode,
    MostFree,
    PackingPolicy,
    ProjectPolicy,
    kind,
    mix_of,
    take,
)
from harness import Run, Stopwatch

WORKLOADS = ("default", "gpushare100", "multigpu50", "gpuspec33")
DONORS = 6
MARKS = (0.9, 1.0, 1.1)
STOP = 1.3


def read_nodes() -> list[GpuNode]:
    return [GpuNode(n.name, f"donor-{i % DONORS}", n.model, (1000,) * n.gpus, n.cpu_milli, n.memory_mib,
                    trusted=i % DONORS < DONORS // 2) for i, n in enumerate(alibaba_trace.read_nodes())]


def read_demands(workload: str) -> list[Demand]:
    demands = []
    for t in alibaba_trace.read_tasks(workload):
        fractional = t.gpus == 1 and 0 < t.gpu_milli < 1000
        demands.append(Demand(t.gpu_milli if fractional else 1000, t.gpus, t.cpu_milli, t.memory_mib,
                              frozenset(t.models)))
    return demands


def replay(policy: PackingPolicy, nodes: list[GpuNode], demands: list[Demand]) -> dict[str, object]:
    pool = {n.name: n for n in nodes}
    order = [n.name for n in nodes]
    capacity = sum(sum(n.free) for n in nodes)
    asked = allocated = started = 0
    at: dict[float, tuple[float, int]] = {}
    marks = list(MARKS)
    i = 0
    clock = Stopwatch()
    while asked < STOP * capacity:
        demand = demands[i % len(demands)]
        i += 1
        asked += demand.total
        choice = policy.choose([pool[name] for name in order], demand)
        if choice is not None:
            pool[choice.node] = take(pool[choice.node], choice, demand)
            allocated += demand.total
            started += 1
        while marks and asked >= marks[0] * capacity:
            at[marks.pop(0)] = (1 - allocated / capacity, started)
    return {"at": at, "seconds": clock.seconds, "tasks": i}


def policies(demands: list[Demand]) -> list[PackingPolicy]:
    return [BestFit(), MostFree(), Fgd(mix_of(kind(d) for d in demands)), ProjectPolicy()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS[:2]))
    args = parser.parse_args(argv)
    if alibaba_trace.missing():
        print(alibaba_trace.missing(), file=sys.stderr)
        return 2
    run = Run("fractions", "Fractions of GPUs packed onto the Alibaba 2023 GPU pool, per packing policy")
    nodes = read_nodes()
    run.note(f"pool: {len(nodes)} nodes, {sum(len(n.free) for n in nodes)} GPUs, {DONORS} donors; tasks arrive "
             f"in trace order until the GPUs asked reach {STOP:.0%} of the pool")
    for workload in args.workloads.split(","):
        demands = read_demands(workload)
        shares = sum(d.fractional for d in demands)
        run.note(f"{workload}: {len(demands)} GPU tasks, {shares} ask for a share of one GPU")
        for policy in policies(demands):
            result = replay(policy, nodes, demands)
            at = result["at"]
            assert isinstance(at, dict)
            for mark in MARKS:
                unallocated, started = at[mark]
                run.figure(f"{workload}, {policy.name}: unallocated at {mark:.0%} demand", 100 * unallocated, "%")
                run.figure(f"{workload}, {policy.name}: tasks started by {mark:.0%} demand", started, "tasks",
                           lower_is_better=False)
            seconds = result["seconds"]
            assert isinstance(seconds, float)
            run.figure(f"{workload}, {policy.name}: replay time", seconds, "s")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
