"""core/v1 Events written by the sandbox's controllers, shaped like the real components' events."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .defaults import now
from .errors import ApiError

if TYPE_CHECKING:
    from .api import Api


def event(obj: Mapping[str, Any], type_: str, reason: str, message: str, component: str,
          host: str = "", field_path: str = "") -> dict[str, Any]:
    """An Event about ``obj`` (pure)."""
    meta = obj.get("metadata") or {}
    involved: dict[str, Any] = {"kind": obj.get("kind", ""), "apiVersion": obj.get("apiVersion", "v1"),
                                "name": meta.get("name", ""), "uid": meta.get("uid", ""),
                                "resourceVersion": meta.get("resourceVersion", "")}
    if meta.get("namespace"):
        involved["namespace"] = meta["namespace"]
    if field_path:
        involved["fieldPath"] = field_path
    stamp = now()
    source: dict[str, str] = {"component": component}
    if host:
        source["host"] = host
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}",
                     "namespace": meta.get("namespace") or "default"},
        "involvedObject": involved, "reason": reason, "message": message, "type": type_,
        "source": source, "reportingComponent": component, "reportingInstance": host or component,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


def record(api: Api, obj: Mapping[str, Any], type_: str, reason: str, message: str, component: str,
           host: str = "", field_path: str = "") -> None:
    """Write an Event; a namespace being deleted (or gone) just loses it, as on a real cluster.

    The same event again (same object, source, type, reason and message) raises the count and lastTimestamp
    of the first one, as client-go's event correlator does, so a probe failing every second writes one
    Event, not thousands.
    """
    body = event(obj, type_, reason, message, component, host, field_path)
    involved = {k: v for k, v in body["involvedObject"].items() if k != "resourceVersion"}  # as client-go keys
    same = hashlib.sha256(json.dumps([involved, body["source"], type_, reason, message],
                                     sort_keys=True).encode()).hexdigest()[:16]
    body["metadata"]["name"] = f"{body['involvedObject']['name'] or 'object'}.{same}"
    events = api.type("", "v1", "events")
    with contextlib.suppress(ApiError), api.store.lock:
        found = api.find(events, body["metadata"]["namespace"], body["metadata"]["name"])
        if found is None:
            api.create(events, body)
            return
        found = dict(found, count=int(found.get("count") or 1) + 1, lastTimestamp=body["lastTimestamp"])
        api.replace(events, body["metadata"]["namespace"], body["metadata"]["name"], found)
