"""Kueue's state of the pool in words: a pure function of the objects as the API returns them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import labels as L

Obj = Mapping[str, Any]


def _totals(entries: Iterable[Obj]) -> dict[str, dict[str, str]]:
    """``{flavor: {resource: total}}`` from a status's flavorsUsage or flavorsReservation."""
    return {f["name"]: {r["name"]: str(r.get("total", 0)) for r in f.get("resources") or []} for f in entries}


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def queue_records(name: str, queue: Obj | None, flavors: Iterable[Obj], priority_classes: Iterable[Obj],
                  local_queues: Iterable[Obj]) -> dict[str, Any]:
    """The ClusterQueue ``name`` as data (``gpu-offload queues --json``): its flavors in the order Kueue tries
    them, with donor, model, quota and usage, its workload counts, and the LocalQueues and priority classes
    that feed it. ``found`` is false when there is no such ClusterQueue."""
    if queue is None:
        return {"clusterQueue": name, "found": False, "flavors": [], "localQueues": [], "priorityClasses": []}
    status = queue.get("status") or {}
    used = _totals(status.get("flavorsUsage") or [])
    by_name = {f["metadata"]["name"]: f for f in flavors}
    rows = []
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            quota = {r["name"]: str(r["nominalQuota"]) for r in flavor.get("resources") or []}
            notes = ((by_name.get(flavor["name"]) or {}).get("metadata") or {}).get("annotations") or {}
            rows.append({"flavor": flavor["name"], "cluster": notes.get(L.REMOTE_CLUSTER_ID_LABEL, "?"),
                         "model": notes.get(L.GPU_MODEL, "-"), "gpus": quota.get(L.GPU_RESOURCE, "0"),
                         "gpusUsed": used.get(flavor["name"], {}).get(L.GPU_RESOURCE, "0"),
                         "cpu": quota.get("cpu", "0"), "memory": quota.get("memory", "0")})
    mine = sorted((q for q in local_queues if (q.get("spec") or {}).get("clusterQueue") == name),
                  key=lambda q: (q["metadata"].get("namespace", ""), q["metadata"]["name"]))
    return {
        "clusterQueue": name, "found": True, "pending": status.get("pendingWorkloads", 0),
        "reserving": status.get("reservingWorkloads", 0), "admitted": status.get("admittedWorkloads", 0),
        "flavors": rows,
        "localQueues": [{"name": f"{q['metadata'].get('namespace')}/{q['metadata']['name']}",
                         "pending": (q.get("status") or {}).get("pendingWorkloads", 0),
                         "admitted": (q.get("status") or {}).get("admittedWorkloads", 0)} for q in mine],
        "priorityClasses": [{"name": c["metadata"]["name"], "value": int(c.get("value", 0))}
                            for c in sorted(priority_classes, key=lambda c: -int(c.get("value", 0)))],
    }


def render_queues(name: str, queue: Obj | None, flavors: Iterable[Obj], priority_classes: Iterable[Obj],
                  local_queues: Iterable[Obj]) -> str:
    """The ClusterQueue ``name`` in words (:func:`queue_records` as a table)."""
    data = queue_records(name, queue, flavors, priority_classes, local_queues)
    if not data["found"]:
        return f"no ClusterQueue {name}: run `gpu-offload queues sync` (or turn queueing on in the hub)"
    header = ["FLAVOR", "CLUSTER", "MODEL", "GPUS", "GPUS USED", "CPU", "MEMORY"]
    keys = ["flavor", "cluster", "model", "gpus", "gpusUsed", "cpu", "memory"]
    rows = [header] + [[str(f[k]) for k in keys] for f in data["flavors"]]
    lines = [f"ClusterQueue {name}: {data['pending']} pending, {data['reserving']} reserving, "
             f"{data['admitted']} admitted"]
    lines += _table(rows) if len(rows) > 1 else ["no flavors: no donor grants GPUs, nothing is admitted"]
    if data["localQueues"]:
        lines.append("")
        lines += _table([["LOCALQUEUE", "PENDING", "ADMITTED"]]
                        + [[q["name"], str(q["pending"]), str(q["admitted"])] for q in data["localQueues"]])
    if data["priorityClasses"]:
        lines.append("")
        lines.append("priority classes: " + ", ".join(f"{c['name']} ({c['value']})" for c in data["priorityClasses"]))
    return "\n".join(lines)
