"""Placement policies replayed on a production GPU-cluster trace: how many GPU tasks each one places.

The trace is Alibaba's cluster-trace-gpu-v2023 (Weng et al., "Beware of Fragmentation", USENIX ATC '23), read
from ../shared/traces/alibaba-gpu-v2023/ and never copied here: 1,213 GPU nodes (6,212 GPUs, seven models)
and task lists with creation and deletion times, CPU, memory, GPUs and allowed GPU models.

The model of the pool, and what it leaves out:
- the nodes are dealt round-robin to ``DONORS`` donor clusters; each trace node is one virtual node, so the
  project's ``place`` sees 1,213 virtual nodes, their models and their free GPUs, exactly as in a cell;
- tasks arrive and leave at their trace times; a task that cannot be placed on arrival is rejected (a cell
  fails with "no cluster has ..."), not queued;
- the project places whole GPUs only, so a task sharing a GPU (``gpu_milli`` < 1000) gets a whole one;
- each virtual node reports its free CPU and memory. Two request kinds are replayed side by side:
  "GPUs only" (a request without CPU or memory, as cells without ``GPU_OFFLOAD_MEMORY`` send) and "GPUs +
  CPU + memory" (the task's own). When the chosen node lacks the task's CPU or memory, the donor's scheduler
  answers Unschedulable and the backend retries once on another cluster (``src/gpu_offload/engine/backends/kube/run.py``);
  the replay does the same and counts both outcomes;
- a rejection is "fragmented" when the pool had enough free GPUs of an allowed model in total, just not on
  one node.

Two modes per policy. "trace times": tasks arrive and leave when the trace says; the trace is light (at most
71 GPUs busy at once), so this shows placement under little pressure. "fill", as the ATC '23 paper
evaluates: tasks arrive in trace order and never leave until the GPUs asked for reach 130% of the pool; the
figure is the share of GPUs allocated when the demand first equalled the pool (the rest stayed idle).

Queue mode (issue 15), per timed workload with the default policy and GPU-only requests: the pool is shrunk
to every k-th node (so the model mix stays), k the smallest that makes dropping refuse at least ``CONTENDED``
of the tasks; on that pool the same arrivals are replayed twice, "drop" (as above) and "queue": a task that does not
fit waits, and whenever GPUs free the waiting tasks are tried in arrival order, a later one starting if it
fits while an earlier one does not (Kueue's BestEffortFIFO). A task runs its trace duration from when it
starts. A queued task starts where the project's placement finds a node with room: Kueue's flavor quota,
which counts a donor's GPUs in total, would admit it there too; the case Kueue's quota admits but no single
node holds (fragmentation inside a flavor) is not modelled. Reported per mode: GPU utilisation over the busy
period (time with a task running or waiting) and while some task waits, tasks dropped, tasks that never
start (no node of their model is large enough), and per task size the mean and p95 wait. Tasks without a
deletion time are left out of this mode.

Writes one JSON result (bench/harness.py) with the machine and the date.
Run: ``.venv/bin/python bench/bench_trace_placement.py [--donors 6] [--queue-only] [--workloads default]``.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace

import alibaba_trace  # bench/: the script's folder is on sys.path
from alibaba_trace import NEVER, TraceNode, TraceTask
from gpu_offload.liqo_peering.errors import NoFit, UnknownModel
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord
from gpu_offload.liqo_peering.placement import POLICIES, PlacementPolicy, PlacementRequest, place
from harness import Run, Stopwatch

WORKLOADS = ("default", "gpuspec33", "multigpu50", "gpushare100")
DONORS = 6
FILL_LOAD = 1.3
"""Fill mode stops once the GPUs asked for reach this multiple of the pool's."""
MIB = 2**20
CONTENDED = 0.10
"""Queue mode shrinks the pool until dropping refuses at least this share of the tasks."""


@dataclass
class Node:
    """A trace node as a virtual node, with what the replayed tasks use of it."""

    spec: TraceNode
    cluster: str
    used_gpus: int = 0
    used_cpu: int = 0
    used_memory: int = 0

    def has_room_for(self, task: TraceTask) -> bool:
        """Whether the donor's scheduler would also find the task's CPU and memory here."""
        return (self.used_cpu + task.cpu_milli <= self.spec.cpu_milli
                and self.used_memory + task.memory_mib <= self.spec.memory_mib)


def read_nodes(donors: int) -> list[Node]:
    return [Node(n, f"donor-{i % donors}") for i, n in enumerate(alibaba_trace.read_nodes())]


class Pool:
    """The donors' inventory, rebuilt per change only for the cluster that changed."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = {n.spec.name: n for n in nodes}
        self._members: dict[str, list[str]] = {}
        for n in nodes:
            self._members.setdefault(n.cluster, []).append(n.spec.name)
        self._clusters = {cid: self._cluster(cid) for cid in sorted(self._members)}
        self.inventory = Inventory(tuple(self._clusters.values()))

    @staticmethod
    def _record(n: Node) -> VirtualNodeRecord:
        return VirtualNodeRecord(n.spec.name, n.cluster, n.spec.gpus, n.spec.gpus, n.used_gpus, model=n.spec.model,
                                 cpu_free=n.spec.cpu_milli - n.used_cpu,
                                 memory_free=(n.spec.memory_mib - n.used_memory) * MIB)

    def _cluster(self, cid: str) -> ClusterRecord:
        records = tuple(self._record(self.nodes[name]) for name in self._members[cid])
        return ClusterRecord(cid, cid, "Provider", "healthy", virtual_nodes=records)

    def _changed(self, node: Node) -> None:
        cluster = self._clusters[node.cluster]
        record = self._record(node)
        self._clusters[node.cluster] = replace(cluster, virtual_nodes=tuple(
            record if vn.name == node.spec.name else vn for vn in cluster.virtual_nodes))
        self.inventory = Inventory(tuple(self._clusters.values()))

    def take(self, node: Node, task: TraceTask) -> None:
        node.used_gpus += task.gpus
        node.used_cpu += task.cpu_milli
        node.used_memory += task.memory_mib
        self._changed(node)

    def give_back(self, node: Node, task: TraceTask) -> None:
        node.used_gpus -= task.gpus
        node.used_cpu -= task.cpu_milli
        node.used_memory -= task.memory_mib
        self._changed(node)

    def one_node_has(self, task: TraceTask) -> bool:
        """Whether some node of an allowed model has the task's GPUs free (whatever its CPU and memory)."""
        wanted = {m.lower() for m in task.models}
        return any(n.spec.gpus - n.used_gpus >= task.gpus and (not wanted or n.spec.model.lower() in wanted)
                   for n in self.nodes.values())

    def free_of(self, models: tuple[str, ...]) -> int:
        wanted = {m.lower() for m in models}
        return sum(n.spec.gpus - n.used_gpus for n in self.nodes.values() if not wanted or n.spec.model.lower() in wanted)

    @property
    def gpus(self) -> int:
        return sum(n.spec.gpus for n in self.nodes.values())

    @property
    def used(self) -> int:
        return sum(n.used_gpus for n in self.nodes.values())


@dataclass
class Tally:
    tasks: int = 0
    demand: int = 0
    placed: int = 0
    placed_on_retry: int = 0
    no_room: int = 0
    no_resources: int = 0
    fragmented: int = 0
    refused_twice: int = 0
    rejected_gpus: int = 0
    shared_whole: int = 0
    allocation: list[float] | None = None
    decide_ms: list[float] | None = None


def events(tasks: list[TraceTask]) -> Iterator[tuple[int, int, TraceTask]]:
    """Arrivals and departures in time order; at one instant departures first (their GPUs are free again)."""
    yield from sorted([(t.created, 1, t) for t in tasks] + [(t.deleted, 0, t) for t in tasks],
                      key=lambda e: (e[0], e[1], e[2].name))


def attempt(pool: Pool, task: TraceTask, policy: PlacementPolicy, tally: Tally, sized: bool) -> Node | None:
    """Place one arriving task as the kubernetes backend would (one retry elsewhere); count the outcome.

    ``sized``: the request carries the task's CPU and memory, else GPUs only."""
    assert tally.decide_ms is not None
    tally.tasks += 1
    tally.demand += task.gpus
    request = PlacementRequest(task.gpus, task.models[0] if task.models else None, fallback_models=task.models[1:],
                               cpu=task.cpu_milli if sized else 0, memory=task.memory_mib * MIB if sized else 0)
    avoid: set[str] = set()
    for retry in (0, 1):
        start = Stopwatch()
        try:
            chosen = place(pool.inventory, request, policy, avoid=avoid)
        except NoFit:
            tally.decide_ms.append(start.ms)
            if retry:
                tally.refused_twice += 1
            elif pool.one_node_has(task):
                tally.no_resources += 1  # a node has the GPUs, none with them has the CPU or memory too
            elif pool.free_of(task.models) >= task.gpus:
                tally.fragmented += 1
            else:
                tally.no_room += 1
            break
        tally.decide_ms.append(start.ms)
        node = pool.nodes[chosen.virtual_node]
        if node.has_room_for(task):
            tally.placed += 1
            tally.placed_on_retry += retry
            tally.shared_whole += task.shares
            pool.take(node, task)
            return node
        avoid.add(node.cluster)  # the donor's scheduler says Unschedulable: the backend retries once elsewhere
    else:
        tally.refused_twice += 1
    tally.rejected_gpus += task.gpus
    return None


def replay(nodes: list[Node], tasks: list[TraceTask], policy: PlacementPolicy, sized: bool) -> Tally:
    """Tasks arrive and leave at their trace times."""
    pool = Pool(nodes)
    tally = Tally(allocation=[], decide_ms=[])
    assert tally.allocation is not None
    placed: dict[str, Node] = {}
    for _, arriving, task in events(tasks):
        if arriving:
            node = attempt(pool, task, policy, tally, sized)
            if node is not None:
                placed[task.name] = node
            tally.allocation.append(pool.used / pool.gpus)
        elif task.name in placed:
            pool.give_back(placed.pop(task.name), task)
    return tally


def fill(nodes: list[Node], tasks: list[TraceTask], policy: PlacementPolicy, sized: bool,
         load: float = FILL_LOAD) -> tuple[Tally, float]:
    """The ATC '23 way: tasks in trace order (the list repeated as needed), none leaving, until the GPUs asked
    for reach ``load`` times the pool's; returns the tally and the share of GPUs allocated when the demand
    first reached the pool's size (the rest were left unallocated by fragmentation and refusals)."""
    pool = Pool(nodes)
    tally = Tally(allocation=[], decide_ms=[])
    at_capacity = 0.0
    ordered = sorted(tasks, key=lambda t: (t.created, t.name))
    asked = 0
    while asked < load * pool.gpus:
        for task in ordered:
            if asked >= load * pool.gpus:
                break
            before = asked
            asked += task.gpus
            attempt(pool, task, policy, tally, sized)
            if before < pool.gpus <= asked:
                at_capacity = pool.used / pool.gpus
    return tally, at_capacity


@dataclass
class Contention:
    """One replay of the shrunk pool, dropping or queueing."""

    gpu_seconds: float = 0.0
    busy_seconds: float = 0.0
    waiting_seconds: float = 0.0
    """Time with a task waiting (queue mode), and the GPU-seconds used meanwhile."""
    gpu_seconds_waiting: float = 0.0
    dropped: int = 0
    started: int = 0
    waits: dict[int, list[int]] | None = None
    """Task size (GPUs) -> seconds each started task of that size waited."""
    never: int = 0


def contend(nodes: list[Node], tasks: list[TraceTask], queue: bool) -> Contention:
    """Arrivals at trace times, each task running its trace duration from its start; ``queue``: a task that
    does not fit waits (BestEffortFIFO) instead of being dropped."""
    pool, out = Pool(nodes), Contention(waits={})
    assert out.waits is not None
    arrivals = sorted(tasks, key=lambda t: (t.created, t.name))
    running: list[tuple[int, str, TraceTask, Node]] = []
    waiting: list[TraceTask] = []
    last, i = arrivals[0].created, 0

    def start(task: TraceTask, now: int) -> bool:
        request = PlacementRequest(task.gpus, task.models[0] if task.models else None,
                                   fallback_models=task.models[1:])
        try:
            chosen = place(pool.inventory, request)
        except (NoFit, UnknownModel):  # no model of the shrunk pool fits it: it never starts
            return False
        node = pool.nodes[chosen.virtual_node]
        pool.take(node, task)
        heapq.heappush(running, (now + task.deleted - task.created, task.name, task, node))
        out.started += 1
        out.waits.setdefault(task.gpus, []).append(now - task.created)  # type: ignore[union-attr]
        return True

    while i < len(arrivals) or running:
        now = min(arrivals[i].created if i < len(arrivals) else NEVER, running[0][0] if running else NEVER)
        out.gpu_seconds += pool.used * (now - last)
        out.busy_seconds += (now - last) if running or waiting else 0
        if waiting:
            out.waiting_seconds += now - last
            out.gpu_seconds_waiting += pool.used * (now - last)
        last = now
        if running and running[0][0] == now:  # departures first: their GPUs are free for this instant
            while running and running[0][0] == now:
                _, _, task, node = heapq.heappop(running)
                pool.give_back(node, task)
            waiting = [t for t in waiting if not (pool.free_of(t.models) >= t.gpus and start(t, now))]
            continue
        task, i = arrivals[i], i + 1
        if not start(task, now):
            if queue:
                waiting.append(task)
            else:
                out.dropped += 1
    out.never = len(waiting)
    return out


def queue_figures(run: Run, workload: str, nodes: list[Node], tasks: list[TraceTask]) -> None:
    """Drop and queue side by side on a pool shrunk until the trace contends for it."""
    tasks = [t for t in tasks if t.deleted != NEVER and t.deleted >= t.created]

    def contends(k: int) -> Contention | None:
        drop = contend([replace(n) for n in nodes[::k]], tasks, queue=False)
        return drop if drop.dropped >= CONTENDED * len(tasks) else None
    # the largest pool (smallest k) that contends: double k, then bisect between the last two
    low, high = 1, 1
    while contends(high) is None and len(nodes[::high]) > 1:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if contends(middle) is not None else (middle, high)
    k, pool = high, nodes[::high]
    drop = contends(high) or contend([replace(n) for n in pool], tasks, queue=False)
    queued = contend([replace(n) for n in pool], tasks, queue=True)
    gpus = sum(n.spec.gpus for n in pool)
    sizes = sorted(set((drop.waits or {}) | (queued.waits or {})))
    run.note(f"{workload}, queue mode: {len(tasks)} GPU tasks with both times; pool shrunk to every {k}th node: "
             f"{len(pool)} nodes / {gpus} GPUs, the largest such pool where dropping refuses >= {CONTENDED:.0%}")
    for mode, c in (("drop", drop), ("queue (BestEffortFIFO)", queued)):
        name = f"{workload}, queue mode, {mode}"
        run.figure(f"{name}: started", c.started, "tasks", lower_is_better=False)
        run.figure(f"{name}: dropped", c.dropped, "tasks")
        run.figure(f"{name}: never start", c.never, "tasks")
        run.figure(f"{name}: GPU utilisation over the busy period",
                   100 * c.gpu_seconds / (gpus * c.busy_seconds) if c.busy_seconds else 0.0, "%",
                   lower_is_better=False)
        run.figure(f"{name}: busy period", c.busy_seconds / 3600, "h")
        if c.waiting_seconds:
            run.figure(f"{name}: GPU utilisation while a task waits",
                       100 * c.gpu_seconds_waiting / (gpus * c.waiting_seconds), "%", lower_is_better=False)
        for size in sizes:
            waits = (c.waits or {}).get(size, [])
            if waits:
                run.figure(f"{name}: wait of {size}-GPU tasks", [w / 3600 for w in waits], "h")


def _tally(run: Run, name: str, t: Tally) -> None:
    run.figure(f"{name}: placed", 100 * t.placed / t.tasks, "% of tasks", lower_is_better=False)
    run.figure(f"{name}: placed on the retry", t.placed_on_retry, "tasks")
    for why, count in (("no GPUs", t.no_room), ("fragmented", t.fragmented), ("no CPU or memory", t.no_resources),
                       ("refused twice", t.refused_twice)):
        run.figure(f"{name}: rejected, {why}", count, "tasks")
    assert t.decide_ms is not None
    run.figure(f"{name}: place() time", t.decide_ms, "ms")


def figures(run: Run, workload: str, nodes: list[Node], tasks: list[TraceTask]) -> None:
    run.note(f"{workload}: {len(tasks)} GPU tasks asking {sum(t.gpus for t in tasks)} whole GPUs "
             f"({sum(t.shares for t in tasks)} share a GPU, {sum(bool(t.models) for t in tasks)} constrain the "
             f"model); {len(nodes)} nodes / {sum(n.spec.gpus for n in nodes)} GPUs in {len({n.cluster for n in nodes})} "
             "donors")
    timed = any(t.deleted != NEVER for t in tasks)  # some files carry no times: fill mode only
    for policy_name, policy in POLICIES.items():
        for sized in (False, True):
            kind = "GPUs + CPU + memory" if sized else "GPUs only"
            if timed:
                t = replay([replace(n) for n in nodes], tasks, policy, sized)
                assert t.allocation is not None
                _tally(run, f"{workload}, {policy_name}, {kind}, trace times", t)
                run.figure(f"{workload}, {policy_name}, {kind}, trace times: peak GPUs allocated",
                           100 * max(t.allocation), "%", lower_is_better=False)
            t, at_capacity = fill([replace(n) for n in nodes], tasks, policy, sized)
            _tally(run, f"{workload}, {policy_name}, {kind}, fill to {FILL_LOAD:.0%}", t)
            run.figure(f"{workload}, {policy_name}, {kind}, fill to {FILL_LOAD:.0%}: GPUs allocated when demand "
                       "= pool", 100 * at_capacity, "%", lower_is_better=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=DONORS, help="donor clusters the nodes are dealt to")
    parser.add_argument("--queue-only", action="store_true", help="only the queue mode's figures")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="trace workloads (comma-separated)")
    args = parser.parse_args()
    if alibaba_trace.missing():
        print(alibaba_trace.missing(), file=sys.stderr)
        return 2
    nodes = read_nodes(args.donors)
    run = Run("trace_placement", "Placement policies replayed on the Alibaba GPU trace (cluster-trace-gpu-v2023)")
    for workload in args.workloads.split(","):
        tasks = alibaba_trace.read_tasks(workload)
        if not args.queue_only:
            figures(run, workload, nodes, tasks)
        if any(t.deleted != NEVER for t in tasks):
            queue_figures(run, workload, nodes, tasks)
    run.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
