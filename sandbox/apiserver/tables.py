"""Server-side printing: the ``meta.k8s.io/v1 Table`` kubectl asks for (``Accept: ...;as=Table``), so
``kubectl get pods`` shows READY, STATUS and RESTARTS instead of only NAME and AGE. Columns follow the
real printers for the kinds the project uses; custom resources use their CRD's additionalPrinterColumns
(simple ``.a.b`` paths); everything else gets Name and Age."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from dateutil.parser import isoparse

from .resources import ResourceType

Obj = dict[str, Any]
Column = tuple[str, str, Callable[[Obj], Any], int]  # name, type, value, priority (1: -o wide only)


def wants_table(accept: str) -> bool:
    """Whether the client asked for a Table (kubectl does; the generated clients do not)."""
    return "as=Table" in accept


def age(obj: Obj) -> str:
    """Age as kubectl prints it: 42s, 5m, 3h, 2d."""
    return since(obj.get("metadata", {}).get("creationTimestamp"))


def since(stamp: str | None) -> str:
    """Time since ``stamp`` (RFC 3339) as kubectl prints it: 42s, 5m, 3h, 2d; ``<unknown>`` without one."""
    if not stamp:
        return "<unknown>"
    seconds = int((datetime.now(timezone.utc) - isoparse(stamp)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _pod_status(pod: Obj) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        for key in ("waiting", "terminated"):
            if (state.get(key) or {}).get("reason"):
                return str(state[key]["reason"])
    return str(status.get("reason") or status.get("phase") or "Pending")


def _pod_ready(pod: Obj) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return f"{sum(1 for c in statuses if c.get('ready'))}/{len(pod.get('spec', {}).get('containers', []))}"


def _node_status(node: Obj) -> str:
    conds = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []}
    text = "Ready" if conds.get("Ready") == "True" else "NotReady" if "Ready" in conds else "Unknown"
    return text + (",SchedulingDisabled" if node.get("spec", {}).get("unschedulable") else "")


def _job_status(job: Obj) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return "Running"


def _event_cells(event: Obj) -> list[Any]:
    # the cells of kube-apiserver's event printer, wide (the server sends every column; kubectl hides
    # the priority-1 ones unless -o wide)
    involved = event.get("involvedObject") or {}
    kind = str(involved.get("kind", "")).lower()
    first = since(event.get("firstTimestamp") or event.get("eventTime"))
    last = since(event.get("lastTimestamp")) if event.get("lastTimestamp") else first
    count = int(event.get("count") or 1)
    series = event.get("series") or {}
    if series:
        last, count = since(series.get("lastObservedTime")), int(series.get("count") or 1)
    source = event.get("source") or {}
    origin = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    return [last, event.get("type", ""), event.get("reason", ""),
            f"{kind}/{involved['name']}" if involved.get("name") else kind, involved.get("fieldPath", ""),
            f"{origin}, {host}" if host else origin, str(event.get("message", "")).strip(), first,
            count, event["metadata"]["name"]]


def _event_column(index: int) -> Callable[[Obj], Any]:
    return lambda event: _event_cells(event)[index]


_EVENT_COLUMNS = (("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1),
                  ("Message", 0), ("First Seen", 1), ("Count", 1), ("Name", 1))


def _path(path: str) -> Callable[[Obj], Any]:
    parts = [p for p in path.strip(".").split(".") if p]

    def get(obj: Obj) -> Any:
        cur: Any = obj
        for part in parts:
            cur = cur.get(part) if isinstance(cur, dict) else None
        return "<none>" if cur is None else cur

    return get


_NAME: Column = ("Name", "string", lambda o: o["metadata"]["name"], 0)
_AGE: Column = ("Age", "string", age, 0)
COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [_NAME, ("Ready", "string", _pod_ready, 0), ("Status", "string", _pod_status, 0),
                   ("Restarts", "integer", lambda p: sum(c.get("restartCount", 0) for c in
                                                         (p.get("status") or {}).get("containerStatuses") or []), 0),
                   _AGE, ("IP", "string", _path(".status.podIP"), 1), ("Node", "string", _path(".spec.nodeName"), 1)],
    ("", "nodes"): [_NAME, ("Status", "string", _node_status, 0), ("Roles", "string", lambda n: "<none>", 0), _AGE,
                    ("Version", "string", _path(".status.nodeInfo.kubeletVersion"), 0)],
    ("", "namespaces"): [_NAME, ("Status", "string", _path(".status.phase"), 0), _AGE],
    ("batch", "jobs"): [_NAME, ("Status", "string", _job_status, 0),
                        ("Completions", "string", lambda j: f"{(j.get('status') or {}).get('succeeded', 0)}/"
                                                            f"{j.get('spec', {}).get('completions') or 1}", 0), _AGE],
    ("", "events"): [(name, "integer" if name == "Count" else "string", _event_column(i), priority)
                     for i, (name, priority) in enumerate(_EVENT_COLUMNS)],
    ("", "secrets"): [_NAME, ("Type", "string", _path(".type"), 0),
                      ("Data", "integer", lambda s: len(s.get("data") or {}), 0), _AGE],
}


def _columns(rt: ResourceType, printer_columns: list[Obj]) -> list[Column]:
    if rt.key in COLUMNS:
        return COLUMNS[rt.key]
    extra: list[Column] = [(c["name"], c.get("type", "string"), _path(c["jsonPath"]), c.get("priority", 0))
                           for c in printer_columns if c.get("jsonPath", "").startswith(".")
                           and c["jsonPath"] != ".metadata.creationTimestamp"]
    return [_NAME, *extra, _AGE]


def table(rt: ResourceType, objects: list[Obj], resource_version: str, include_object: str,
          printer_columns: list[Obj] | None = None) -> Obj:
    """A Table of ``objects`` with one row each; ``include_object`` is the query's includeObject."""
    columns = _columns(rt, printer_columns or [])

    def row_object(obj: Obj) -> Obj:
        if include_object == "Object":
            return obj
        if include_object == "None":
            return {}
        return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}

    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n,
                               "priority": p} for n, t, _, p in columns],
        "rows": [{"cells": [get(obj) for _, _, get, _ in columns], "object": row_object(obj)} for obj in objects],
    }
