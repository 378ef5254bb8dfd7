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


def render_queues(name: str, queue: Obj | None, flavors: Iterable[Obj], priority_classes: Iterable[Obj],
                  local_queues: Iterable[Obj]) -> str:
    """The ClusterQueue ``name``: its flavors in the order Kueue tries them, with donor, model, quota and
    usage, its pending and admitted workloads, and the LocalQueues and priority classes that feed it."""
    if queue is None:
        return f"no ClusterQueue {name}: run `gpu-offload queues sync` (or turn queueing on in the hub)"
    status = queue.get("status") or {}
    used = _totals(status.get("flavorsUsage") or [])
    by_name = {f["metadata"]["name"]: f for f in flavors}
    rows = [["FLAVOR", "CLUSTER", "MODEL", "GPUS", "GPUS USED", "CPU", "MEMORY"]]
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            quota = {r["name"]: str(r["nominalQuota"]) for r in flavor.get("resources") or []}
            notes = ((by_name.get(flavor["name"]) or {}).get("metadata") or {}).get("annotations") or {}
            rows.append([flavor["name"], notes.get(L.REMOTE_CLUSTER_ID_LABEL, "?"), notes.get(L.GPU_MODEL, "-"),
                         quota.get(L.GPU_RESOURCE, "0"), used.get(flavor["name"], {}).get(L.GPU_RESOURCE, "0"),
                         quota.get("cpu", "0"), quota.get("memory", "0")])
    lines = [f"ClusterQueue {name}: {status.get('pendingWorkloads', 0)} pending, "
             f"{status.get('reservingWorkloads', 0)} reserving, {status.get('admittedWorkloads', 0)} admitted"]
    lines += _table(rows) if len(rows) > 1 else ["no flavors: no donor grants GPUs, nothing is admitted"]
    mine = [q for q in local_queues if (q.get("spec") or {}).get("clusterQueue") == name]
    if mine:
        lines.append("")
        queue_rows = [["LOCALQUEUE", "PENDING", "ADMITTED"]]
        for q in sorted(mine, key=lambda q: (q["metadata"].get("namespace", ""), q["metadata"]["name"])):
            qs = q.get("status") or {}
            queue_rows.append([f"{q['metadata'].get('namespace')}/{q['metadata']['name']}",
                               str(qs.get("pendingWorkloads", 0)), str(qs.get("admittedWorkloads", 0))])
        lines += _table(queue_rows)
    classes = sorted(priority_classes, key=lambda c: -int(c.get("value", 0)))
    if classes:
        lines.append("")
        lines.append("priority classes: " + ", ".join(f"{c['metadata']['name']} ({c.get('value', 0)})" for c in classes))
    return "\n".join(lines)
