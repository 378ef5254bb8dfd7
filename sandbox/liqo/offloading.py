"""Liqo's namespace offloading, as pure functions: admission, status, the pod webhook, OffloadingBackOff.

What Liqo v1 does and the sandbox reproduces:

- only a NamespaceOffloading named ``offloading`` is honoured (the sandbox rejects any other name);
- a namespace offloaded with strategy Remote or LocalAndRemote gets ``liqo.io/scheduling-enabled=true`` (with
  Local it does not); its NamespaceOffloading reports phase ``Ready`` when the cluster selector picks at least
  one virtual node (``NoClusterSelected`` otherwise), and the namespace exists on those donors whatever the
  strategy;
- a pod created in a namespace offloaded with Remote or LocalAndRemote gets the toleration of the virtual-node
  taint (Exists, NoExecute) and, as required node affinity, the strategy's node selector ANDed with its own
  (``offloading_terms``: LocalAndRemote with no cluster selector imposes none);
  with Local it is left as it is (``mutatePod`` in ``pkg/webhooks/pod/mutations.go`` of liqotech/liqo returns
  at once), so only a pod that tolerates the taint itself reaches a virtual node;
- a pod bound to a virtual node from a namespace that is not offloaded to that node's cluster is never
  started: it stays Pending with reason ``OffloadingBackOff``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from ..apiserver.matching import and_node_selectors, node_selector_matches
from .seed import ORIGIN_CLUSTER_ID, TYPE_LABEL, VIRTUAL_NODE_TAINT, VIRTUAL_NODE_TYPE

NAMESPACE_OFFLOADING_NAME = "offloading"
SCHEDULING_LABEL = "liqo.io/scheduling-enabled"
OFFLOADING_BACKOFF = "OffloadingBackOff"
VIRTUAL_NODE_TOLERATION: dict[str, str] = {"key": VIRTUAL_NODE_TAINT["key"], "operator": "Exists",
                                           "effect": "NoExecute"}

_ONLY_VIRTUAL = {"key": TYPE_LABEL, "operator": "In", "values": [VIRTUAL_NODE_TYPE]}
_NOT_VIRTUAL = {"key": TYPE_LABEL, "operator": "NotIn", "values": [VIRTUAL_NODE_TYPE]}


def namespace_offloading_problem(obj: Mapping[str, Any]) -> str | None:
    """Why Liqo would refuse this NamespaceOffloading, or None."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if name != NAMESPACE_OFFLOADING_NAME:
        return (f'NamespaceOffloading "{name}" in namespace "{meta.get("namespace")}" is not honoured: Liqo '
                f'only acts on the one named "{NAMESPACE_OFFLOADING_NAME}"; create it under that name')
    return None


def strategy(spec: Mapping[str, Any]) -> str:
    """The pod offloading strategy, with Liqo's default."""
    return str(spec.get("podOffloadingStrategy") or "LocalAndRemote")


def _cluster_terms(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(t) for t in (spec.get("clusterSelector") or {}).get("nodeSelectorTerms") or []]


def offloading_terms(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The node selector terms Liqo's webhook requires of pods in the namespace (none: the pod's affinity is
    left as it is). Remote: the cluster selector's terms, each also requiring a virtual node. LocalAndRemote:
    the cluster selector's terms as they are, plus one term for any local node; none when the selector is
    empty (every node is allowed already). Local: none (``createNodeSelectorFromNamespaceOffloading`` in
    Liqo's pod webhook; real Liqo 1.2 showed the LocalAndRemote shape, tests/realcluster/test_real_liqo.py)."""
    chosen = strategy(spec)
    cluster = _cluster_terms(spec)
    if chosen == "Remote":
        return and_node_selectors(cluster, [{"matchExpressions": [dict(_ONLY_VIRTUAL)]}])
    if chosen == "Local" or not cluster:
        return []
    return [*cluster, {"matchExpressions": [dict(_NOT_VIRTUAL)]}]


def mutate_pod(pod: Mapping[str, Any], offloading_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as Liqo's webhook admits it into an offloaded namespace (a new dict; ``pod`` is untouched)."""
    out = copy.deepcopy(dict(pod))
    if strategy(offloading_spec) == "Local":
        return out
    spec = out.setdefault("spec", {})
    tolerations = spec.setdefault("tolerations", [])
    if VIRTUAL_NODE_TOLERATION not in tolerations:
        tolerations.append(dict(VIRTUAL_NODE_TOLERATION))
    imposed = offloading_terms(offloading_spec)
    if not imposed:
        return out
    required = (spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    required["nodeSelectorTerms"] = and_node_selectors(required.get("nodeSelectorTerms") or [], imposed)
    return out


def remote_namespace_name(namespace: str, spec: Mapping[str, Any]) -> str:
    """The namespace's twin in the donors, per the mapping strategy."""
    mapping = spec.get("namespaceMappingStrategy") or "DefaultName"
    if mapping == "EnforceSameName":
        return namespace
    if mapping == "SelectedName" and spec.get("remoteNamespaceName"):
        return str(spec["remoteNamespaceName"])
    return f"{namespace}-{ORIGIN_CLUSTER_ID}"


def donor_namespaces(offloadings: Iterable[Mapping[str, Any]], node: Mapping[str, Any]) -> dict[str, str]:
    """Origin namespace -> its twin on the donor ``node`` (a virtual node) leads to, for every namespace
    offloaded there: the names a pod running on that donor resolves Services under."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    cluster = labels.get("liqo.io/remote-cluster-id")
    out = {}
    for obj in offloadings:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if meta.get("deletionTimestamp"):
            continue
        if cluster in selected_clusters(spec, [node]):
            out[str(meta["namespace"])] = remote_namespace_name(str(meta["namespace"]), spec)
    return out


def selected_clusters(spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """Cluster ids of the virtual nodes the NamespaceOffloading's cluster selector picks."""
    terms = _cluster_terms(spec)
    picked = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(TYPE_LABEL) != VIRTUAL_NODE_TYPE:
            continue
        if not terms or node_selector_matches({"nodeSelectorTerms": terms}, labels, meta.get("name", "")):
            picked.append(labels.get("liqo.io/remote-cluster-id", meta.get("name", "")))
    return sorted(set(picked))


def offloading_status(obj: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]],
                      now: str) -> dict[str, Any]:
    """The status Liqo's controller reports on a NamespaceOffloading, given the origin's nodes."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    clusters = selected_clusters(spec, nodes)
    conditions = {
        cid: [{"type": "OffloadingRequired", "status": "True", "reason": "ClusterSelected",
               "lastTransitionTime": now},
              {"type": "Ready", "status": "True", "reason": "RemoteNamespaceCreated",
               "lastTransitionTime": now}]
        for cid in clusters
    }
    return {
        "observedGeneration": int(meta.get("generation") or 1),
        "offloadingPhase": "Ready" if clusters else "NoClusterSelected",
        "remoteNamespaceName": remote_namespace_name(str(meta.get("namespace")), spec),
        "remoteNamespacesConditions": conditions,
    }


def offloading_backoff_status(pod: Mapping[str, Any], node_name: str) -> dict[str, Any]:
    """Status of a pod bound to a virtual node from a namespace that is not offloaded."""
    ns = (pod.get("metadata") or {}).get("namespace")
    return {
        "phase": "Pending",
        "reason": OFFLOADING_BACKOFF,
        "message": (f'virtual node {node_name} cannot offload pods of namespace "{ns}": it is not offloaded to '
                    f'that cluster. Create a NamespaceOffloading named "{NAMESPACE_OFFLOADING_NAME}" in it whose '
                    "clusterSelector picks the cluster, then recreate the pod"),
    }
