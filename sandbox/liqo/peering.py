"""Donors peered into a running origin and unpeered from it, as ``liqoctl peer`` and ``liqoctl unpeer`` do.

Peering a donor at run time leaves what seeding it at start-up leaves (``seed.donor_objects``): its tenant
namespace, its ForeignCluster, its granted ResourceSlice, the VirtualNode made for that slice (owned by it) and
the virtual node's Node. The slice controller learns the donor too, so a slice made for it later gets a virtual
node of its model and price.

Unpeering follows ``liqoctl unpeer`` (liqotech/liqo ``pkg/liqoctl/unpeer/handler.go``), consumer side:

1. offloading off: every ResourceSlice of the provider is deleted, then every VirtualNode of it, and the
   command waits until they are gone. A VirtualNode's end (``virtualnodes.py``) cordons its Node, evicts the
   pods on it (a Job's or ReplicaSet's pod is made again by its controller and waits for a node; a bare pod is
   gone), then deletes the Node: the GPUs it offered leave the cluster;
2. authentication and networking off (the Identity, the gateways: objects the sandbox does not have);
3. the tenant namespace deleted (``liqoctl unpeer`` without ``--keep-namespaces``), with what is left in it.

The ForeignCluster goes too: with no module enabled any more, nothing of the peering is left to describe (the
sandbox has no discovery that would keep one for a cluster it is not peered with). What Liqo reflected to the
donor goes with the namespaces' twins there (``DonorCopies.forget``): a cluster peered again under the same id
starts with nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, MutableMapping
from typing import Any

from ..apiserver.api import Api
from ..apiserver.errors import ApiError
from . import seed as liqo
from .controllers import create_with_status
from .reflection import DonorCopies
from .virtualnodes import owner_reference

FOREIGN_CLUSTER = ("core.liqo.io/v1beta1", "ForeignCluster")
RESOURCE_SLICE = ("authentication.liqo.io/v1beta1", "ResourceSlice")
VIRTUAL_NODE = ("offloading.liqo.io/v1beta1", "VirtualNode")
UNPEER_TIMEOUT = 120.0
"""Seconds an unpeer waits for the donor's virtual nodes to drain (liqoctl's default timeout is 120 s)."""


def peered(api: Api) -> list[str]:
    """The cluster ids the origin has a ForeignCluster for."""
    return sorted(fc["metadata"]["name"] for fc in api.store.list(api.kind(*FOREIGN_CLUSTER).key)[0])


def _free_index(api: Api) -> int:
    # the seeded virtual nodes' addresses are 127.0.2.<index + 1>: the first one no node has
    taken = {a.get("address") for n in api.store.list(("", "nodes"))[0]
             for a in (n.get("status") or {}).get("addresses") or []}
    return next(i for i in range(254) if f"127.0.2.{i + 1}" not in taken)


def peer(api: Api, donors: Iterable[liqo.Donor], known: MutableMapping[str, liqo.Donor]) -> None:
    """Peer each donor into the running origin: its objects as seeding makes them. A donor already peered (a
    ForeignCluster of its id exists) is refused before anything is made."""
    donor_list = list(donors)
    ids = [d.cluster_id for d in donor_list]
    clash = sorted({i for i in ids if ids.count(i) > 1} | (set(ids) & set(peered(api))))
    if clash:
        raise ValueError(f"peer: {', '.join(clash)} already peered (or named twice); unpeer it first or use "
                         "another cluster id")
    for donor in donor_list:
        known[donor.cluster_id] = donor
        made_slice: dict[str, Any] | None = None
        for obj in liqo.donor_objects(donor, _free_index(api)):
            if obj["kind"] == "Namespace" and api.find(api.type("", "v1", "namespaces"), "", obj["metadata"]["name"]):
                continue
            if obj["kind"] == "VirtualNode" and made_slice is not None:  # Liqo makes the slice its owner
                obj["metadata"]["ownerReferences"] = [owner_reference(made_slice)]
            created = create_with_status(api, obj)
            if obj["kind"] == "ResourceSlice":
                made_slice = created


def _of_cluster(api: Api, kind: tuple[str, str], cluster: str) -> list[dict[str, Any]]:
    items = api.store.list(api.kind(*kind).key)[0]
    return [o for o in items if ((o["metadata"].get("labels") or {}).get(liqo.REMOTE_CLUSTER_ID_LABEL) == cluster
                                 or (o.get("spec") or {}).get("clusterID") == cluster
                                 or (o.get("spec") or {}).get("providerClusterID") == cluster)]


def _delete_all(api: Api, kind: tuple[str, str], objects: Iterable[dict[str, Any]]) -> None:
    rt = api.kind(*kind)
    for obj in objects:
        try:
            api.delete(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        except ApiError as exc:
            if exc.code != 404:  # gone already is what we want
                raise


async def _until(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"unpeer: {what} after {timeout:.0f} s; see the origin's log for the VirtualNode "
                               "that could not end")
        await asyncio.sleep(0.05)


async def unpeer(api: Api, cluster_ids: Iterable[str], known: MutableMapping[str, liqo.Donor],
                 copies: DonorCopies | None = None, timeout: float = UNPEER_TIMEOUT) -> None:
    """Unpeer each cluster from the running origin, as ``liqoctl unpeer`` does; returns once its slices, virtual
    nodes (and so the pods they ran), ForeignCluster and tenant namespace are gone. An id not peered is refused
    before anything is deleted."""
    ids = list(cluster_ids)
    missing = sorted(set(ids) - set(peered(api)))
    if missing:
        raise ValueError(f"unpeer: {', '.join(missing)} not peered (peered: {', '.join(peered(api)) or 'none'})")
    for cluster in ids:
        await _unpeer_one(api, cluster, timeout)
        known.pop(cluster, None)
        if copies is not None:
            copies.forget(cluster)


async def _unpeer_one(api: Api, cluster: str, timeout: float) -> None:
    node_rt, ns_rt = api.type("", "v1", "nodes"), api.type("", "v1", "namespaces")
    # offloading off: slices, then virtual nodes (their end drains and deletes the Nodes)
    _delete_all(api, RESOURCE_SLICE, _of_cluster(api, RESOURCE_SLICE, cluster))
    _delete_all(api, VIRTUAL_NODE, _of_cluster(api, VIRTUAL_NODE, cluster))

    def drained() -> bool:
        nodes = [n for n in api.store.list(node_rt.key)[0]
                 if liqo.is_virtual_node(n) and n["metadata"]["labels"].get(liqo.REMOTE_CLUSTER_ID_LABEL) == cluster]
        return not nodes and not _of_cluster(api, VIRTUAL_NODE, cluster)
    await _until(drained, f"{cluster}'s virtual nodes still there", timeout)
    fc = api.find(api.kind(*FOREIGN_CLUSTER), "", cluster)
    tenant = ((fc or {}).get("status") or {}).get("tenantNamespace", {}).get("local") or f"liqo-tenant-{cluster}"
    _delete_all(api, FOREIGN_CLUSTER, [fc] if fc else [])
    if api.find(ns_rt, "", tenant) is not None:  # liqoctl unpeer without --keep-namespaces
        _delete_all(api, ("v1", "Namespace"), [{"metadata": {"name": tenant}}])
    await _until(lambda: api.find(ns_rt, "", tenant) is None, f"tenant namespace {tenant} still there", timeout)
