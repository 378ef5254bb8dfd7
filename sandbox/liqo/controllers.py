"""Liqo's behaviour on the origin, wired into the API: seeding, webhooks and the two controllers.

- ``seed(api, donors)``: creates the topology of ``liqo.py`` (status written through ``/status``, as Liqo's
  controllers would);
- admission: a NamespaceOffloading not named ``offloading`` is refused (422); a pod created in an offloaded
  namespace is mutated as Liqo's pod webhook does (``offloading.mutate_pod``);
- the offloading controller labels a namespace offloaded with Remote or LocalAndRemote
  ``liqo.io/scheduling-enabled=true`` and writes the NamespaceOffloading's status (and removes the label when
  it goes);
- the ResourceSlice controller grants a slice's requested resources on behalf of the provider (when the
  slice is new or its spec changed) and makes the VirtualNode's quota and its Node's capacity follow the
  granted resources, creating both for a new slice of a known donor (owned by the slice, so deleting the slice
  deletes them: ``virtualnodes.py`` drains and deletes the Node before the VirtualNode goes);
- the gate keeps pods bound to a virtual node from a namespace that is not offloaded to that node's cluster
  Pending with reason OffloadingBackOff (the kubelet never runs them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from ..apiserver import crds
from ..apiserver.admission import AdmissionRequest
from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError, Cause
from ..apiserver.patching import MERGE
from . import offloading
from . import seed as liqo
from .virtualnodes import owner_reference

NSOFF = ("offloading.liqo.io/v1beta1", "NamespaceOffloading")


def ensure_crds(api: Api) -> None:
    """Serve the Liqo kinds: keep what ``--crds`` loaded, add the built-in description for the rest."""
    for crd in crds.builtin_crds():
        names = crd["spec"]["names"]
        api_version = f"{crd['spec']['group']}/{crds.LIQO_VERSION}"
        if api.registry.by_kind(api_version, names["kind"]) is None:
            api.registry.add_crd(crd)


def create_with_status(api: Api, obj: dict[str, Any]) -> dict[str, Any]:
    """Create ``obj``; a custom resource's status is then written through ``/status``, as a controller would."""
    rt = api.kind(obj["apiVersion"], obj["kind"])
    status = obj.get("status")
    created = api.create(rt, {k: v for k, v in obj.items() if k != "status" or not rt.custom},
                         obj["metadata"].get("namespace", ""))
    if status and rt.custom:
        meta = created["metadata"]
        created = api.patch(rt, meta.get("namespace", ""), meta["name"], {"status": status}, MERGE, "status")
    return created


def seed(api: Api, donors: tuple[liqo.Donor, ...]) -> None:
    """Create the origin's Liqo topology for ``donors`` (nothing that already exists is touched)."""
    slices: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in liqo.topology(donors):
        meta = obj["metadata"]
        where = (meta.get("namespace", ""), meta["name"])
        if obj["kind"] == "VirtualNode" and where in slices:  # Liqo makes the slice its owner
            meta["ownerReferences"] = [owner_reference(slices[where])]
        with contextlib.suppress(ApiError):
            if obj["kind"] == "Namespace" and api.find(api.type("", "v1", "namespaces"), "", meta["name"]):
                continue
            created = create_with_status(api, obj)
            if obj["kind"] == "ResourceSlice":
                slices[where] = created


# ---- admission --------------------------------------------------------------------------------------
def _offloading_of(api: Api, namespace: str) -> dict[str, Any] | None:
    obj = api.find(api.kind(*NSOFF), namespace, offloading.NAMESPACE_OFFLOADING_NAME)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    return obj


def _check_offloading_name(req: AdmissionRequest) -> list[Cause]:
    problem = offloading.namespace_offloading_problem(req.object)
    return [Cause("FieldValueInvalid", problem, "metadata.name")] if problem else []


def install_admission(api: Api) -> None:
    """Register Liqo's NamespaceOffloading check and pod webhook."""
    def pod_webhook(req: AdmissionRequest) -> None:
        nsoff = _offloading_of(api, req.namespace)
        if nsoff is not None:
            mutated = offloading.mutate_pod(req.object, nsoff.get("spec") or {})
            req.object.clear()
            req.object.update(mutated)

    api.admission.add_validating("namespaceoffloadings.offloading.liqo.io", _check_offloading_name, ("CREATE",))
    api.admission.add_mutating("pods", pod_webhook, ("CREATE",))


def offloading_gate(api: Api) -> Any:
    """The kubelet gate: OffloadingBackOff for virtual-node pods of namespaces that are not offloaded."""
    def gate(pod: dict[str, Any]) -> dict[str, Any] | None:
        node_name = pod["spec"]["nodeName"]
        node = api.find(api.type("", "v1", "nodes"), "", node_name)
        if node is None or not liqo.is_virtual_node(node):
            return None
        nsoff = _offloading_of(api, pod["metadata"]["namespace"])
        # the donor's virtual kubelet runs pods of the namespaces offloaded to it only (its fallback reflector
        # marks any other pod OffloadingBackOff: pkg/virtualKubelet/reflection/workload/pod.go of liqotech/liqo)
        cluster = node["metadata"]["labels"].get(liqo.REMOTE_CLUSTER_ID_LABEL)
        if nsoff is not None and cluster in offloading.selected_clusters(nsoff.get("spec") or {}, [node]):
            return None
        return offloading.offloading_backoff_status(pod, node_name)
    return gate


def donor_names(api: Api) -> Any:
    """The kubelet's name view: a pod on a virtual node runs on the donor, in its namespace's twin there
    (``<namespace>-origin`` under Liqo's default mapping), and resolves the Services reflected there under
    that name; None for a pod on an origin node."""
    def view(pod: dict[str, Any]) -> dict[str, str] | None:
        node = api.find(api.type("", "v1", "nodes"), "", (pod.get("spec") or {}).get("nodeName") or "")
        if node is None or not liqo.is_virtual_node(node):
            return None
        return offloading.donor_namespaces(api.store.list(api.kind(*NSOFF).key)[0], node)
    return view


# ---- NamespaceOffloading controller -----------------------------------------------------------------
def _summary(status: Mapping[str, Any] | None) -> tuple[Any, ...]:
    status = status or {}
    return (status.get("offloadingPhase"), status.get("remoteNamespaceName"), status.get("observedGeneration"),
            tuple(sorted(status.get("remoteNamespacesConditions") or {})))


def reconcile_offloading(api: Api, obj: dict[str, Any], deleted: bool = False) -> None:
    """Bring the namespace label and the NamespaceOffloading status in line with ``obj``."""
    meta = obj["metadata"]
    if meta["name"] != offloading.NAMESPACE_OFFLOADING_NAME:
        return
    ns_rt = api.type("", "v1", "namespaces")
    gone = deleted or meta.get("deletionTimestamp")
    # Liqo labels the namespace (which its pod webhook selects on) for Remote and LocalAndRemote only
    value = None if gone or offloading.strategy(obj.get("spec") or {}) == "Local" else "true"
    with contextlib.suppress(ApiError):
        ns = api.get(ns_rt, "", meta["namespace"])
        if (ns["metadata"].get("labels") or {}).get(offloading.SCHEDULING_LABEL) != value:
            api.patch(ns_rt, "", meta["namespace"], {"metadata": {"labels": {offloading.SCHEDULING_LABEL: value}}},
                      MERGE)
    if gone:
        return
    nodes, _ = api.store.list(("", "nodes"))
    status = offloading.offloading_status(obj, nodes, now())
    if _summary(status) != _summary(obj.get("status")):
        with contextlib.suppress(ApiError):
            api.patch(api.kind(*NSOFF), meta["namespace"], meta["name"], {"status": status}, MERGE, "status")


async def offloading_controller(api: Api) -> None:
    """Reconcile every NamespaceOffloading now and on each change; never returns."""
    rt = api.kind(*NSOFF)
    items, rv = api.store.list(rt.key)
    for obj in items:
        reconcile_offloading(api, obj)
    sub = api.store.subscribe(rt.key, since=rv)
    try:
        async for event in sub:
            reconcile_offloading(api, event.object, deleted=event.type == "DELETED")
    finally:
        sub.close()
