"""ResourceSlices to virtual nodes: the provider's grant and the consumer's VirtualNode and Node.

On the origin, Liqo turns a granted ResourceSlice into a VirtualNode whose Node offers what was granted.
A deleted slice takes its VirtualNode and Node along (``virtualnodes.py``).
Here the provider side is emulated too: a slice whose spec is new or changed is granted as requested if
its ``providerClusterID`` is a known donor (ForeignCluster present), denied otherwise. Whatever writes the
grant (this controller, or a test patching ``status.resources`` as a provider would), the VirtualNode's
``spec.resourceQuota.hard`` and the Node's capacity and allocatable follow it.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Mapping
from typing import Any

from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError
from ..apiserver.patching import MERGE
from . import seed as liqo
from .controllers import create_with_status
from .virtualnodes import owner_reference

_NODE_IPS = (f"127.0.3.{i}" for i in itertools.count(1))


def _replace_map(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    # a merge patch that leaves exactly ``new``: keys it lacks are deleted with null
    return {**{k: None for k in (old or {}) if k not in new}, **new}


def grant_status(slice_obj: Mapping[str, Any], provider_known: bool) -> dict[str, Any]:
    """The status a provider writes on a slice: everything requested, or Denied for an unknown provider."""
    verdict = "Accepted" if provider_known else "Denied"
    conditions = [{"type": t, "status": verdict, "lastTransitionTime": now()} for t in ("Authentication", "Resources")]
    if not provider_known:
        provider = (slice_obj.get("spec") or {}).get("providerClusterID")
        conditions[1]["message"] = f"no peered cluster {provider!r}: peer it first (ForeignCluster missing)"
    resources = dict((slice_obj.get("spec") or {}).get("resources") or {}) if provider_known else {}
    return {"conditions": conditions, "resources": resources}


class SliceController:
    """Grants slices and keeps their virtual nodes in step."""

    def __init__(self, api: Api, donors: Mapping[str, liqo.Donor]) -> None:
        self.api = api
        self.donors = dict(donors)
        self._granted: dict[str, int] = {}  # slice uid -> generation last granted or seen granted

    def reconcile(self, obj: dict[str, Any]) -> None:
        """Grant ``obj`` if needed, then make its VirtualNode and Node follow the grant."""
        meta = obj["metadata"]
        generation = int(meta.get("generation") or 1)
        granted = any(c.get("type") == "Resources" for c in (obj.get("status") or {}).get("conditions") or [])
        seen = self._granted.get(meta["uid"])
        if granted and seen is None:
            self._granted[meta["uid"]] = generation
        elif not granted or seen != generation:
            self._granted[meta["uid"]] = generation
            provider = (obj.get("spec") or {}).get("providerClusterID", "")
            known = self.api.find(self.api.kind("core.liqo.io/v1beta1", "ForeignCluster"), "", provider) is not None
            with contextlib.suppress(ApiError):
                rt = self.api.kind(obj["apiVersion"], obj["kind"])
                obj = self.api.patch(rt, meta["namespace"], meta["name"], {"status": grant_status(obj, known)},
                                     MERGE, "status")
        capacity = liqo.capacity_from_slice(obj)
        if capacity is not None:
            with contextlib.suppress(ApiError):
                self._sync_nodes(obj, capacity)

    def _sync_nodes(self, obj: dict[str, Any], capacity: dict[str, str]) -> None:
        meta = obj["metadata"]
        provider = (obj.get("spec") or {}).get("providerClusterID", "")
        vn_rt = self.api.kind("offloading.liqo.io/v1beta1", "VirtualNode")
        node_rt = self.api.type("", "v1", "nodes")
        vnode = self.api.find(vn_rt, meta["namespace"], meta["name"])
        if vnode is None:
            self._create_nodes(obj, provider, capacity)
            return
        hard = ((vnode.get("spec") or {}).get("resourceQuota") or {}).get("hard")
        if hard != capacity:
            self.api.patch(vn_rt, meta["namespace"], meta["name"],
                           {"spec": {"resourceQuota": {"hard": _replace_map(hard, capacity)}}}, MERGE)
        node = self.api.find(node_rt, "", meta["name"])
        if node is not None and (node.get("status") or {}).get("capacity") != capacity:
            status = node.get("status") or {}
            patch = {"capacity": _replace_map(status.get("capacity"), capacity),
                     "allocatable": _replace_map(status.get("allocatable"), capacity)}
            self.api.patch(node_rt, "", meta["name"], {"status": patch}, MERGE, "status")

    def _create_nodes(self, slice_obj: dict[str, Any], provider: str, capacity: dict[str, str]) -> None:
        namespace, name = slice_obj["metadata"]["namespace"], slice_obj["metadata"]["name"]
        donor = self.donors.get(provider) or liqo.Donor(provider, 0, "unknown", "0")
        vnode = liqo.virtual_node(donor)
        # owned by the slice, as Liqo's virtualnodecreator makes it: the slice's deletion takes the node along
        vnode["metadata"].update(name=name, namespace=namespace, ownerReferences=[owner_reference(slice_obj)])
        vnode["metadata"]["labels"][liqo.RESOURCE_SLICE_NAME_LABEL] = name
        vnode["spec"]["resourceQuota"]["hard"] = dict(capacity)
        node = liqo.virtual_node_node(donor, 0)
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["status"].update(capacity=dict(capacity), allocatable=copy.deepcopy(capacity),
                              addresses=[{"type": "InternalIP", "address": next(_NODE_IPS)},
                                         {"type": "Hostname", "address": name}])
        create_with_status(self.api, vnode)
        create_with_status(self.api, node)


async def slice_controller(api: Api, donors: Mapping[str, liqo.Donor]) -> None:
    """Reconcile every ResourceSlice now and on each change; never returns."""
    controller = SliceController(api, donors)
    rt = api.kind("authentication.liqo.io/v1beta1", "ResourceSlice")
    items, rv = api.store.list(rt.key)
    for obj in items:
        controller.reconcile(dict(obj, apiVersion=rt.api_version))
    sub = api.store.subscribe(rt.key, since=rv)
    try:
        async for event in sub:
            if event.type != "DELETED":
                controller.reconcile(dict(copy.deepcopy(event.object), apiVersion=rt.api_version))
    finally:
        sub.close()
