"""The Liqo custom resource definitions the sandbox serves, and validation of objects against them.

With ``--crds DIR`` the sandbox loads Liqo's real manifests. Without it, it serves the project's own short
description below: only the four Liqo kinds and the fields the project reads or writes, everything else
left open (``x-kubernetes-preserve-unknown-fields``), so an installed package works with no Liqo checkout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

LIQO_VERSION = "v1beta1"
# libyaml's loader when present: Liqo's VirtualNode CRD alone is 9,000 lines, seconds with the pure one
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_OPEN: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_STR = {"type": "string"}
_ID = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
_QUANTITIES = {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True,
                                                          "anyOf": [{"type": "integer"}, {"type": "string"}]}}
_STR_MAP = {"type": "object", "additionalProperties": _STR}


def _conditions(types: list[str], statuses: list[str]) -> dict[str, Any]:
    item = {"type": "object", "required": ["type", "status"],
            "properties": {"type": {"type": "string", "enum": types},
                           "status": {"type": "string", "enum": statuses},
                           "reason": _STR, "message": _STR, "lastTransitionTime": _STR}}
    return {"type": "array", "items": item}


_FC_CONDITION_TYPES = ["APIServerStatus", "NetworkConnectionStatus", "NetworkGatewayServerStatus",
                       "NetworkGatewayClientStatus", "NetworkGatewayPresence", "NetworkConfigurationStatus",
                       "AuthIdentityControlPlaneStatus", "AuthTenantStatus", "OffloadingVirtualNodeStatus",
                       "OffloadingNodeStatus"]
_FC_STATUSES = ["None", "Pending", "Established", "Error", "Ready", "NotReady", "SomeNotReady"]
_FC_MODULE = {"type": "object", "required": ["enabled"],
              "properties": {"enabled": {"type": "boolean"},
                             "conditions": _conditions(_FC_CONDITION_TYPES, _FC_STATUSES)}}
_NODE_SELECTOR = {"type": "object", "required": ["nodeSelectorTerms"],
                  "properties": {"nodeSelectorTerms": {"type": "array", "items": _OPEN}}}


def _crd(group: str, kind: str, plural: str, scope: str, short: list[str],
         spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object",
              "properties": {"apiVersion": _STR, "kind": _STR, "metadata": {"type": "object"},
                             "spec": {**spec, "x-kubernetes-preserve-unknown-fields": True},
                             "status": {**status, "x-kubernetes-preserve-unknown-fields": True}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group, "scope": scope,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                      "singular": kind.lower(), "shortNames": short, "categories": ["liqo"]},
            "versions": [{"name": LIQO_VERSION, "served": True, "storage": True,
                          "subresources": {"status": {}}, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def builtin_crds() -> list[dict[str, Any]]:
    """The project's own description of the Liqo kinds it uses (a fresh copy each call)."""
    return [
        _crd("core.liqo.io", "ForeignCluster", "foreignclusters", "Cluster", ["fc"],
             {"type": "object", "required": ["clusterID"], "properties": {"clusterID": _ID}},
             {"type": "object", "required": ["role"], "properties": {
                 "role": {"type": "string", "enum": ["Consumer", "Provider", "ConsumerAndProvider", "Unknown"]},
                 "conditions": _conditions(_FC_CONDITION_TYPES, _FC_STATUSES),
                 "modules": {"type": "object", "required": ["authentication", "networking", "offloading"],
                             "properties": {m: _FC_MODULE for m in ("authentication", "networking",
                                                                    "offloading")}}}}),
        _crd("authentication.liqo.io", "ResourceSlice", "resourceslices", "Namespaced", ["rslice"],
             {"type": "object", "properties": {"consumerClusterID": _ID, "providerClusterID": _ID,
                                               "class": _STR, "resources": _QUANTITIES}},
             {"type": "object", "properties": {
                 "resources": _QUANTITIES, "nodeLabels": _STR_MAP,
                 "conditions": _conditions(["Authentication", "Resources"], ["Accepted", "Denied"])}}),
        _crd("offloading.liqo.io", "VirtualNode", "virtualnodes", "Namespaced", ["vn", "vnode"],
             {"type": "object", "properties": {
                 "clusterID": _ID, "createNode": {"type": "boolean"}, "labels": _STR_MAP,
                 "annotations": _STR_MAP, "taints": {"type": "array", "items": _OPEN},
                 "resourceQuota": {"type": "object", "properties": {"hard": _QUANTITIES}}}},
             {"type": "object", "properties": {"conditions": _conditions(
                 ["VirtualKubelet", "Node"], ["None", "Running", "Creating", "Draining", "Deleting"])}}),
        _crd("offloading.liqo.io", "NamespaceOffloading", "namespaceoffloadings",
             "Namespaced", ["nsoff"],
             {"type": "object", "properties": {
                 "clusterSelector": _NODE_SELECTOR,
                 "podOffloadingStrategy": {"type": "string", "enum": ["Local", "Remote", "LocalAndRemote"]},
                 "namespaceMappingStrategy": {"type": "string",
                                              "enum": ["EnforceSameName", "DefaultName", "SelectedName"]}}},
             {"type": "object", "properties": {"offloadingPhase": _STR, "remoteNamespaceName": _STR}}),
    ]


class CRDError(ValueError):
    """A CRD folder or manifest the sandbox cannot use."""


def load_crd_dir(directory: str | Path) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in the ``*.yaml``/``*.yml``/``*.json`` files of ``directory``."""
    folder = Path(directory)
    if not folder.is_dir():
        raise CRDError(f"CRD folder {folder} does not exist: pass --crds a folder of CRD manifests "
                       "(e.g. Liqo's deployments/liqo/charts/liqo-crds/crds) or leave it out to use the "
                       "built-in description")
    crds: list[dict[str, Any]] = []
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".yaml", ".yml", ".json"):
            continue
        try:
            docs = list(yaml.load_all(path.read_text(), Loader=_LOADER))
        except yaml.YAMLError as exc:
            raise CRDError(f"CRD file {path} is not valid YAML ({exc}): fix or remove it") from exc
        crds += [d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]
    if not crds:
        raise CRDError(f"CRD folder {folder} holds no CustomResourceDefinition: point --crds at the folder "
                       "with the *.yaml manifests")
    return crds


@dataclass(frozen=True)
class CRDKind:
    """One served kind of a CRD: what the API needs to route it and check it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    schema: Mapping[str, Any]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def kinds_of(crds: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], CRDKind]:
    """Index the served versions of ``crds`` by (apiVersion, kind)."""
    out: dict[tuple[str, str], CRDKind] = {}
    for crd in crds:
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            entry = CRDKind(spec["group"], version["name"], spec["names"]["kind"], spec["names"]["plural"],
                            spec["scope"] == "Namespaced", version["schema"]["openAPIV3Schema"])
            out[(entry.api_version, entry.kind)] = entry
    return out


def schema_errors(obj: Mapping[str, Any], crds: Iterable[Mapping[str, Any]]) -> list[str]:
    """Why ``obj`` does not satisfy its CRD's openAPIV3Schema, one ``path: message`` per problem."""
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    kind = kinds_of(crds).get(key)
    if kind is None:
        return [f"no CRD serves {key[1]} in {key[0]}: load the CRD that defines it"]
    validator = jsonschema.Draft202012Validator(kind.schema)
    return sorted(
        f"{'.'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in validator.iter_errors(obj)
    )
