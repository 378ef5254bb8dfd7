"""A minimal OpenAPI v3 index, enough for kubectl to see that the server validates fields itself
(``fieldValidation`` on PATCH operations), so ``kubectl create -f`` works without ``--validate=false``:
kubectl then sends ``fieldValidation=Strict`` and leaves validation to the sandbox's strict admission.
No schemas are published (``kubectl explain`` and client-side ``kubectl apply`` merge logic still lack them)."""

from __future__ import annotations

import hashlib
from typing import Any

from .resources import ResourceRegistry, ResourceType

_PARAM = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def root(registry: ResourceRegistry) -> dict[str, Any]:
    """``/openapi/v3``: one entry per group version, each with a content hash as real servers give."""
    paths = {}
    for group, versions in registry.groups().items():
        for version in versions:
            gv = _gv_path(group, version)
            digest = hashlib.sha256(gv.encode()).hexdigest()[:16].upper()
            paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
    return {"paths": paths}


def _object_path(rt: ResourceType) -> str:
    scope = "/namespaces/{namespace}" if rt.namespaced else ""
    return f"/{_gv_path(rt.group, rt.version)}{scope}/{rt.plural}/{{name}}"


def group_version(registry: ResourceRegistry, gv_path: str) -> dict[str, Any] | None:
    """``/openapi/v3/api/v1`` or ``/openapi/v3/apis/<group>/<version>``; None if not served."""
    types = [rt for rt in registry.all() if _gv_path(rt.group, rt.version) == gv_path]
    if not types:
        return None
    paths = {}
    for rt in types:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        operation = {"operationId": f"patch{rt.kind}", "parameters": _PARAM,
                     "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK"}}}
        paths[_object_path(rt)] = {"patch": operation, "put": {**operation, "operationId": f"replace{rt.kind}"}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (sandbox)", "version": "v1.36.0"}, "paths": paths,
            "components": {"schemas": {}}}
