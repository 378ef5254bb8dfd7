"""The EndpointSlice controller: one ``discovery.k8s.io/v1`` EndpointSlice per Service with a selector.

As kube-controller-manager's controller writes them: labels ``kubernetes.io/service-name`` and
``endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io``, an owner reference to the
Service, ``addressType: IPv4``, one endpoint per pod the Service selects that has an IP and has not ended
(``conditions.ready``/``serving``/``terminating``; ``ready`` is true for every endpoint of a Service with
``publishNotReadyAddresses``, terminating ones included, ``nodeName``, ``targetRef``, and ``hostname`` for a pod
whose ``subdomain`` is the Service), and the Service's ports with their target port resolved.

Left out: more than one slice per Service (the real controller splits at 100 endpoints), a port whose named
target resolves differently on different pods (the first pod's number is used), IPv6 and dual stack,
topology hints and zones, and slices of Services without a selector (those are
left to whoever manages them).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from ..apiserver.api import Api
from ..apiserver.errors import ApiError
from .podnames import published, selects
from .serviceproxy import target_port

MANAGED_BY = "endpointslice-controller.k8s.io"
SERVICE_NAME = "kubernetes.io/service-name"


def _endpoint(svc: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    serving = any(c.get("type") == "Ready" and c.get("status") == "True"
                  for c in (pod.get("status") or {}).get("conditions") or [])
    out: dict[str, Any] = {
        "addresses": [pod["status"]["podIP"]],
        "conditions": {"ready": published(svc, pod), "serving": serving,
                       "terminating": bool(meta.get("deletionTimestamp"))},
        "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}
    if spec.get("nodeName"):
        out["nodeName"] = spec["nodeName"]
    if spec.get("hostname") and spec.get("subdomain") == svc["metadata"]["name"]:
        out["hostname"] = spec["hostname"]
    return out


def desired(services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(namespace, name)`` -> the EndpointSlice every selecting Service should have."""
    live = [p for p in pods if (p.get("status") or {}).get("podIP")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for svc in services:
        meta = svc["metadata"]
        if not (svc.get("spec") or {}).get("selector"):
            continue
        chosen = sorted((p for p in live if selects(svc, p)), key=lambda p: p["metadata"]["name"])
        ports = []
        for port in svc["spec"].get("ports") or []:
            number = next((t for p in chosen if (t := target_port(p, port))), None)
            if number is not None or not chosen:
                ports.append({"name": port.get("name", ""), "protocol": port.get("protocol", "TCP"),
                              "port": number if number is not None else port.get("targetPort", port["port"])})
        name = f"{meta['name']}-{hashlib.sha256(meta['uid'].encode()).hexdigest()[:5]}"
        out[(meta["namespace"], name)] = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": meta["namespace"],
                         "labels": {SERVICE_NAME: meta["name"], "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "addressType": "IPv4", "endpoints": [_endpoint(svc, p) for p in chosen],
            "ports": [p for p in ports if isinstance(p["port"], int)]}
    return out


def sync(api: Api) -> None:
    """Make the managed EndpointSlices what the Services and pods say (create, update, delete)."""
    slices = api.type("discovery.k8s.io", "v1", "endpointslices")
    want = desired(api.store.list(api.type("", "v1", "services").key)[0],
                   api.store.list(api.type("", "v1", "pods").key)[0])
    have = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in api.store.list(slices.key)[0]
            if (s["metadata"].get("labels") or {}).get("endpointslice.kubernetes.io/managed-by") == MANAGED_BY}
    for key, body in want.items():
        current = have.get(key)
        # a namespace going away refuses writes, a slice may be gone meanwhile: the next change retries
        with contextlib.suppress(ApiError):
            if current is None:
                api.create(slices, body, key[0])
            elif any(current.get(f) != body.get(f) for f in ("endpoints", "ports")):
                api.replace(slices, key[0], key[1], {**body, "metadata": {
                    **body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}})
    for key in have.keys() - want.keys():
        with contextlib.suppress(ApiError):
            api.delete(slices, key[0], key[1])
