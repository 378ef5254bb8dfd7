"""ResourceSlices to virtual nodes: the provider's grant and the consumer's VirtualNode and Node.

On the origin, Liqo turns a granted ResourceSlice into a VirtualNode whose Node offers what was granted.
A deleted slice takes its VirtualNode and Node along (``virtualnodes.py``).
Here the provider side is emulated too: a slice whose spec is new or changed is granted as requested when
Liqo would send it to a known donor. Whatever writes the grant (this controller, or a test patching
``status.resources`` as a provider would), the VirtualNode's ``spec.resourceQuota.hard`` and the Node's
capacity and allocatable follow it.

What real Liqo (v1.2) requires, and so the sandbox: the consumer's controllers act only on a slice labelled
``liqo.io/replication=true`` with a ``liqo.io/remoteID`` (the CRD replicator's LocalResourcesLabelSelector):
any other slice is never signed, sent or granted. A slice sent to a cluster that is not peered (no
ForeignCluster) reaches nobody: no status is ever written. A VirtualNode is made only for a granted slice
annotated ``liqo.io/create-virtual-node`` (anything but empty or ``false``) and labelled
``liqo.io/remote-cluster-id`` (``virtualnodecreator-controller``).
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


def grant_status(slice_obj: Mapping[str, Any]) -> dict[str, Any]:
    """The status a provider of the default class writes on a slice: everything requested, accepted."""
    conditions = [{"type": t, "status": "Accepted", "lastTransitionTime": now()} for t in ("Authentication", "Resources")]
    return {"conditions": conditions, "resources": dict((slice_obj.get("spec") or {}).get("resources") or {})}


def sent_to(slice_obj: Mapping[str, Any]) -> str | None:
    """The peer Liqo sends this slice to, or None when Liqo leaves it alone (not labelled for replication)."""
    labels = (slice_obj.get("metadata") or {}).get("labels") or {}
    if labels.get(liqo.REPLICATION_LABEL) != "true" or liqo.REPLICATION_DESTINATION_LABEL not in labels:
        return None
    return str(labels[liqo.REPLICATION_DESTINATION_LABEL])


def makes_virtual_node(slice_obj: Mapping[str, Any]) -> str | None:
    """The cluster id of the virtual node Liqo makes for this slice once granted, or None when it makes none."""
    meta = slice_obj.get("metadata") or {}
    asked = str((meta.get("annotations") or {}).get(liqo.CREATE_VIRTUAL_NODE) or "")
    cluster = (meta.get("labels") or {}).get(liqo.REMOTE_CLUSTER_ID_LABEL)
    if not asked or asked.lower() == "false" or not cluster:
        return None
    return str(cluster)


class SliceController:
    """Grants slices and keeps their virtual nodes in step."""

    def __init__(self, api: Api, donors: Mapping[str, liqo.Donor]) -> None:
        self.api = api
        self.donors = donors  # the origin's, read when a slice needs a node: donors peered later are in it too
        self._granted: dict[str, int] = {}  # slice uid -> generation last granted or seen granted

    def reconcile(self, obj: dict[str, Any]) -> None:
        """Grant ``obj`` if needed, then make its VirtualNode and Node follow the grant."""
        meta = obj["metadata"]
        provider = sent_to(obj)
        if provider is None:
            return
        generation = int(meta.get("generation") or 1)
        granted = any(c.get("type") == "Resources" for c in (obj.get("status") or {}).get("conditions") or [])
        seen = self._granted.get(meta["uid"])
        if granted and seen is None:
            self._granted[meta["uid"]] = generation
        elif (not granted or seen != generation) and self._peered(provider):
            self._granted[meta["uid"]] = generation
            with contextlib.suppress(ApiError):
                rt = self.api.kind(obj["apiVersion"], obj["kind"])
                obj = self.api.patch(rt, meta["namespace"], meta["name"], {"status": grant_status(obj)},
                                     MERGE, "status")
        capacity = liqo.capacity_from_slice(obj)
        cluster = makes_virtual_node(obj)
        if capacity is not None and cluster is not None:
            with contextlib.suppress(ApiError):
                self._sync_nodes(obj, cluster, capacity)

    def _peered(self, cluster_id: str) -> bool:
        return self.api.find(self.api.kind("core.liqo.io/v1beta1", "ForeignCluster"), "", cluster_id) is not None

    def _sync_nodes(self, obj: dict[str, Any], provider: str, capacity: dict[str, str]) -> None:
        meta = obj["metadata"]
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
