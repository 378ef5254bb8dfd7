"""core/v1 Events written by the sandbox's controllers, shaped like the real components' events."""

from __future__ import annotations

import contextlib
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
    """Write an Event; a namespace being deleted (or gone) just loses it, as on a real cluster."""
    body = event(obj, type_, reason, message, component, host, field_path)
    with contextlib.suppress(ApiError):
        api.create(api.type("", "v1", "events"), body)
