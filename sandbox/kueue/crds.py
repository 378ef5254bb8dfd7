"""Without Kueue's CRDs (``--crds``), the sandbox serves this short description of the Kueue kinds it
uses: names, scope, the v1beta2 version with a status subresource, and only the fields its controller
requires; everything else is open. Load Kueue's real manifests to have every object validated."""

from __future__ import annotations

from typing import Any

from . import names

_OPEN: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_KINDS: tuple[tuple[str, str, str, list[str]], ...] = (  # kind, plural, scope, required spec fields
    ("ResourceFlavor", "resourceflavors", "Cluster", []),
    ("ClusterQueue", "clusterqueues", "Cluster", []),
    ("LocalQueue", "localqueues", "Namespaced", []),
    ("Workload", "workloads", "Namespaced", ["podSets"]),
    ("WorkloadPriorityClass", "workloadpriorityclasses", "Cluster", []),
)


def builtin_crds() -> list[dict[str, Any]]:
    """Fresh CRD manifests for the Kueue kinds the sandbox emulates."""
    out = []
    for kind, plural, scope, required in _KINDS:
        schema: dict[str, Any] = {"type": "object", "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
            "spec": {**_OPEN, "required": required} if required else _OPEN, "status": _OPEN}}
        if kind == "WorkloadPriorityClass":
            schema["properties"]["value"] = {"type": "integer"}
            schema["properties"]["description"] = {"type": "string"}
            schema["required"] = ["value"]
        out.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{names.GROUP}"},
            "spec": {"group": names.GROUP, "scope": scope,
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                               "singular": kind.lower(), "categories": ["kueue"]},
                     "versions": [{"name": names.VERSION, "served": True, "storage": True,
                                   "subresources": {"status": {}}, "schema": {"openAPIV3Schema": schema}}]}})
    return out
