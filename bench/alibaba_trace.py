"""The Alibaba GPU trace (cluster-trace-gpu-v2023) as typed rows, for the benchmarks that replay it.

Weng et al., "Beware of Fragmentation", USENIX ATC '23. Read from ../shared/traces/alibaba-gpu-v2023/ beside
the repository, never copied here: one file of nodes and one task list per workload. Each benchmark turns these
rows into its own model of the pool; what a row says is read here once.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass

from harness import SHARED  # bench/harness.py: the script's folder is on sys.path

TRACE = SHARED / "traces" / "alibaba-gpu-v2023"
NEVER = 2**62
"""The deletion time of a task the trace gives none."""


@dataclass(frozen=True)
class TraceNode:
    """A GPU node of the trace (nodes without GPUs are left out)."""

    name: str
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class TraceTask:
    """A GPU task of a workload (CPU-only tasks never reach GPU placement and are left out)."""

    name: str
    gpus: int
    gpu_milli: int
    """Thousandths of one GPU asked for; under 1000 a share of a GPU."""
    cpu_milli: int
    memory_mib: int
    models: tuple[str, ...]
    """The GPU models it may run on; empty: any. Some workload files lack the column."""
    created: int
    deleted: int
    """:data:`NEVER` when the trace gives no deletion time."""
    qos: str = ""
    """The task's QoS class (``LS`` latency-sensitive, ``BE`` best-effort, ...): the closest the trace has to a
    priority class."""

    @property
    def shares(self) -> bool:
        """Whether it asks for less than a whole GPU (the project gives such a task a whole one)."""
        return self.gpu_milli < 1000


def missing() -> str | None:
    """Why the trace cannot be read, or None when it is there."""
    if TRACE.is_dir():
        return None
    return f"the trace is not at {TRACE}; it is read from ../shared/traces/ beside the repository"


def read_nodes() -> list[TraceNode]:
    with (TRACE / "openb_node_list_gpu_node.csv").open() as f:
        return [TraceNode(r["sn"], r["model"], int(r["gpu"]), int(r["cpu_milli"]), int(r["memory_mib"]))
                for r in csv.DictReader(f) if int(r["gpu"]) > 0]


def read_tasks(workload: str) -> list[TraceTask]:
    with (TRACE / f"openb_pod_list_{workload}.csv").open() as f:
        rows = list(csv.DictReader(f))
    return [TraceTask(r["name"], int(r["num_gpu"]), int(r["gpu_milli"] or 0), int(r["cpu_milli"]),
                      int(r["memory_mib"]), tuple(m for m in (r.get("gpu_spec") or "").split("|") if m),
                      int(r.get("creation_time") or 0), int(r.get("deletion_time") or NEVER), r.get("qos") or "")
            for r in rows if int(r["num_gpu"]) > 0]


def peak_gpus(tasks: Iterable[tuple[float, int, float, object]]) -> int:
    """The most GPUs held at once by ``tasks``, each ``(arrival, GPUs, hold, what it asked)``, times in seconds."""
    changes: list[tuple[float, int]] = []
    for arrived, gpus, hold, _ in tasks:
        changes += [(arrived, gpus), (arrived + hold, -gpus)]
    held = peak = 0
    for _, change in sorted(changes):
        held += change
        peak = max(peak, held)
    return peak
