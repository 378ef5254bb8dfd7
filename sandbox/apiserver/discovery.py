"""Discovery documents: ``/version``, ``/api``, ``/apis``, and the resource list of each group version.

Plain (non-aggregated) discovery: clients that ask for the aggregated form get this one with the plain
``application/json`` content type, which kubectl and client-go accept as the legacy format.
"""

from __future__ import annotations

from typing import Any

from .resources import VERBS, ResourceRegistry, ResourceType

KUBE_VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0-sandbox", "gitCommit": "sandbox",
                "gitTreeState": "clean", "buildDate": "2026-11-22T00:00:00Z", "goVersion": "go1.25",
                "compiler": "gc", "platform": "linux/amd64"}
_ADDRESS = [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
_SUB_VERBS = {"status": ["get", "patch", "update"], "log": ["get"], "attach": ["create", "get"],
              "exec": ["create", "get"], "portforward": ["create", "get"],
              "binding": ["create"]}


def core_versions() -> dict[str, Any]:
    """``/api``."""
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": _ADDRESS}


def group_list(registry: ResourceRegistry) -> dict[str, Any]:
    """``/apis``: every non-core group with its versions (preferred first)."""
    groups = []
    for group, versions in sorted(registry.groups().items()):
        if not group:
            continue
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        groups.append({"name": group, "versions": gvs, "preferredVersion": gvs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(registry: ResourceRegistry, name: str) -> dict[str, Any] | None:
    """``/apis/<group>``, or None if no such group is served."""
    versions = registry.groups().get(name)
    if not versions or not name:
        return None
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": gvs, "preferredVersion": gvs[0]}


def _entry(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                            "kind": rt.kind, "verbs": list(VERBS)}
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    subs = [{"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
             "kind": "Status" if sub == "binding" else rt.kind, "verbs": _SUB_VERBS.get(sub, ["get"])}
            for sub in rt.subresources]
    if rt.key == ("", "pods"):
        subs.append({"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                     "verbs": ["create"]})
        # kubectl drain evicts only when discovery lists this (else it says to use --disable-eviction)
        subs.append({"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                     "version": "v1", "kind": "Eviction", "verbs": ["create"]})
    return [main, *subs]


def resource_list(registry: ResourceRegistry, group_name: str, version: str) -> dict[str, Any] | None:
    """``/api/v1`` or ``/apis/<group>/<version>``: the resources of one group version."""
    types = [rt for rt in registry.all() if rt.group == group_name and rt.version == version]
    if not types:
        return None
    gv = f"{group_name}/{version}" if group_name else version
    resources = [e for rt in types for e in _entry(rt)]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
