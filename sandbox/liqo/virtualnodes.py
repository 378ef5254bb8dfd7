"""A VirtualNode's end on the origin: its Node is drained and deleted before the VirtualNode goes.

Liqo v1 (liqotech/liqo, ``pkg/liqo-controller-manager/offloading/virtualnode-controller``) puts the finalizer
``virtualnode-controller.liqo.io/finalizer`` on every VirtualNode. When one is deleted it cordons the Node,
evicts the offloaded pods on it and waits until they are gone, deletes the Node (and the virtual kubelet's
Deployment and NamespaceMap, which the sandbox does not have), then removes the finalizer.

A VirtualNode made for a ResourceSlice has that slice as its controller owner (``virtualnodecreator-controller``
sets it), so deleting the slice deletes the VirtualNode through the garbage collector, and with it the Node:
the GPUs it offered leave the cluster. :func:`owner_reference` is that reference.

Simplification: every pod bound to the Node is evicted (in Liqo, the pods the virtual kubelet reflected, which
here is every pod on a virtual node); an eviction is a delete with the pod's own grace period (no
PodDisruptionBudgets in the sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ..apiserver.api import Api
from ..apiserver.errors import ApiError
from ..apiserver.patching import MERGE

log = logging.getLogger(__name__)

FINALIZER = "virtualnode-controller.liqo.io/finalizer"
VIRTUAL_NODE = ("offloading.liqo.io/v1beta1", "VirtualNode")
_POLL = 0.1  # seconds between looks at the pods being evicted (Liqo polls every 10 s)


def owner_reference(slice_obj: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference a VirtualNode made for ``slice_obj`` carries (Liqo's ``SetControllerReference``)."""
    meta = slice_obj["metadata"]
    return {"apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice", "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


def _evictable(pod: Mapping[str, Any], node: str) -> bool:
    meta = pod["metadata"]
    if (pod.get("spec") or {}).get("nodeName") != node:
        return False
    daemon = any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or [])
    mirror = "kubernetes.io/config.mirror" in (meta.get("annotations") or {})
    return not daemon and not mirror


class VirtualNodeLifecycle:
    """Adds Liqo's finalizer to VirtualNodes and carries out their deletion."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._ending: dict[tuple[str, str], asyncio.Task[None]] = {}

    def changed(self, vnode: Mapping[str, Any]) -> None:
        """A VirtualNode was created or changed."""
        meta = vnode["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        finalizers = _finalizers(vnode)
        if meta.get("deletionTimestamp"):
            if FINALIZER in finalizers and key not in self._ending:
                self._ending[key] = asyncio.get_running_loop().create_task(self._end(*key))
        elif FINALIZER not in finalizers:
            with contextlib.suppress(ApiError):  # gone meanwhile: nothing to guard
                self.api.patch(self.api.kind(*VIRTUAL_NODE), key[0], key[1],
                               {"metadata": {"finalizers": [*finalizers, FINALIZER]}}, MERGE)

    async def _end(self, namespace: str, name: str) -> None:
        try:
            await self._drain_and_delete_node(name)
            rt = self.api.kind(*VIRTUAL_NODE)
            vnode = self.api.find(rt, namespace, name)
            if vnode is not None:
                left = [f for f in _finalizers(vnode) if f != FINALIZER]
                self.api.patch(rt, namespace, name, {"metadata": {"finalizers": left or None}}, MERGE)
        except ApiError as exc:  # an API error here would block the VirtualNode for good: say which and why
            log.warning("VirtualNode %s/%s could not be removed (%s); delete its Node %s by hand", namespace, name,
                        exc, name)
        finally:
            self._ending.pop((namespace, name), None)

    async def _drain_and_delete_node(self, name: str) -> None:
        node_rt, pod_rt = self.api.type("", "v1", "nodes"), self.api.type("", "v1", "pods")
        node = self.api.find(node_rt, "", name)
        if node is None:
            return
        if not (node.get("spec") or {}).get("unschedulable"):
            self.api.patch(node_rt, "", name, {"spec": {"unschedulable": True}}, MERGE)
        evicted = {}
        for pod in self.api.store.list(pod_rt.key)[0]:
            if _evictable(pod, name):
                meta = pod["metadata"]
                evicted[(meta["namespace"], meta["name"])] = meta["uid"]
                with contextlib.suppress(ApiError):  # gone already
                    self.api.delete(pod_rt, meta["namespace"], meta["name"])
        while any((found := self.api.find(pod_rt, ns, pod)) is not None and found["metadata"]["uid"] == uid
                  for (ns, pod), uid in evicted.items()):
            await asyncio.sleep(_POLL)
        with contextlib.suppress(ApiError):
            self.api.delete(node_rt, "", name)


async def virtual_node_controller(api: Api) -> None:
    """Keep every VirtualNode's finalizer and end the deleted ones; never returns."""
    lifecycle = VirtualNodeLifecycle(api)
    rt = api.kind(*VIRTUAL_NODE)
    items, rv = api.store.list(rt.key)
    for obj in items:
        lifecycle.changed(obj)
    sub = api.store.subscribe(rt.key, since=rv)
    try:
        async for event in sub:
            if event.type != "DELETED":
                lifecycle.changed(event.object)
    finally:
        sub.close()
