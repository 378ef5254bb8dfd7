"""Liqo's reflection of Secrets and ConfigMaps to donors, played by the sandbox: what each donor holds.

Liqo's virtual kubelet for a donor copies the Secrets and ConfigMaps of every namespace offloaded to that donor
into the namespace's twin there (``pkg/virtualKubelet/reflection/configuration/{secret,configmap}.go`` and
``ShouldSkipReflection`` in ``pkg/virtualKubelet/reflection/generic/namespaced.go`` of liqotech/liqo):

- the namespace is offloaded to the donors its NamespaceOffloading's cluster selector picks, whatever its pod
  offloading strategy (``enforceClusterSelector`` runs before the strategy is looked at);
- a reflector's type is ``DenyList`` by default (Liqo chart ``offloading.reflection.secret.type`` and
  ``.configmap.type``): an object is copied unless annotated ``liqo.io/skip-reflection`` with any value but
  ``false`` (case-insensitive); under ``AllowList`` only objects annotated ``liqo.io/allow-reflection`` with
  any value but ``false`` are;
- Secrets of type ``kubernetes.io/service-account-token`` are never copied by this reflector;
- ``kube-root-ca.crt`` goes under ``kube-root-ca.crt.<first 5 characters of the origin's cluster id>``.

Liqo deletes a donor's copy when the object goes or stops qualifying, but a copy once sent is the donor's:
an untrusted donor need not delete anything. So :class:`DonorCopies` keeps both what each donor holds now and
everything it was ever sent, which is what a test of a leak must look at.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..apiserver.api import Api
from ..kubelet.podfiles import Lookup
from . import offloading
from .seed import ORIGIN_CLUSTER_ID, REMOTE_CLUSTER_ID_LABEL, is_virtual_node

SKIP = "liqo.io/skip-reflection"
ALLOW = "liqo.io/allow-reflection"
DENY_LIST, ALLOW_LIST = "DenyList", "AllowList"
SA_TOKEN = "kubernetes.io/service-account-token"
ROOT_CA = "kube-root-ca.crt"
KINDS = {("", "secrets"): "Secret", ("", "configmaps"): "ConfigMap"}


@dataclass(frozen=True)
class ReflectionTypes:
    """The reflector types of the origin's Liqo (its chart's ``offloading.reflection.<kind>.type``)."""

    secret: str = DENY_LIST
    configmap: str = DENY_LIST

    def of(self, kind: str) -> str:
        return self.secret if kind == "Secret" else self.configmap


def reflected(obj: Mapping[str, Any], kind: str, types: ReflectionTypes = ReflectionTypes()) -> bool:
    """Whether Liqo copies ``obj`` (a Secret or ConfigMap of an offloaded namespace) to the donors."""
    if kind == "Secret" and obj.get("type") == SA_TOKEN:
        return False
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if types.of(kind) == ALLOW_LIST:
        return ALLOW in annotations and str(annotations[ALLOW]).lower() != "false"
    return SKIP not in annotations or str(annotations[SKIP]).lower() == "false"


def remote_name(name: str, kind: str) -> str:
    """The copy's name on the donor."""
    return f"{ROOT_CA}.{ORIGIN_CLUSTER_ID[:5]}" if kind == "ConfigMap" and name == ROOT_CA else name


def offloaded_to(offloadings: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]
                 ) -> dict[str, list[str]]:
    """Namespace -> the donors (cluster ids) it is offloaded to, whatever its pod offloading strategy."""
    node_list = list(nodes)
    out: dict[str, list[str]] = {}
    for obj in offloadings:
        meta = obj.get("metadata") or {}
        if meta.get("name") != offloading.NAMESPACE_OFFLOADING_NAME or meta.get("deletionTimestamp"):
            continue
        out[str(meta["namespace"])] = offloading.selected_clusters(obj.get("spec") or {}, node_list)
    return out


@dataclass
class DonorCopies:
    """What each donor holds of the origin's Secrets and ConfigMaps, and what it was ever sent."""

    types: ReflectionTypes = ReflectionTypes()
    held: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = field(default_factory=dict)
    """Cluster id -> (kind, origin namespace, name) -> the donor's current copy."""
    ever: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Cluster id -> every copy it was sent, in order (versions of one object included)."""
    _sent: set[tuple[str, str, str]] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sync(self, api: Api, changed: Iterable[tuple[str, dict[str, Any]]] = ()) -> None:
        """Bring every donor's copies in line with the origin's objects, as Liqo's reflectors would;
        ``changed`` are (kind, object) versions seen in events, which a donor was sent even if they are gone
        from the store by now."""
        nsoffs, _ = api.store.list(api.kind(*offloading_kind()).key)
        nodes, _ = api.store.list(("", "nodes"))
        targets = offloaded_to(nsoffs, nodes)
        wanted: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {c: {} for cs in targets.values() for c in cs}
        current: list[tuple[str, dict[str, Any]]] = []
        for key, kind in KINDS.items():
            for namespace in targets:
                current += [(kind, obj) for obj in api.store.list(key, namespace)[0]]
        with self._lock:
            for kind, obj in [*changed, *current]:
                if not reflected(obj, kind, self.types):
                    continue
                meta = obj["metadata"]
                for cluster in targets.get(str(meta.get("namespace")), ()):
                    version = (cluster, str(meta.get("uid")), str(meta.get("resourceVersion")))
                    if version not in self._sent:
                        self._sent.add(version)
                        self.ever.setdefault(cluster, []).append(copy.deepcopy(obj))
            for kind, obj in current:
                if reflected(obj, kind, self.types):
                    meta = obj["metadata"]
                    for cluster in targets[str(meta["namespace"])]:
                        wanted[cluster][(kind, str(meta["namespace"]), str(meta["name"]))] = obj
            for cluster in set(self.held) | set(wanted):
                self.held[cluster] = wanted.get(cluster, {})

    def holds(self, cluster: str) -> list[dict[str, Any]]:
        """Copies of the donor's current copies."""
        with self._lock:
            return [copy.deepcopy(o) for o in self.held.get(cluster, {}).values()]

    def was_sent(self, cluster: str) -> list[dict[str, Any]]:
        """Copies of everything the donor was ever sent."""
        with self._lock:
            return [copy.deepcopy(o) for o in self.ever.get(cluster, [])]


    def forget(self, cluster: str) -> None:
        """The donor was unpeered: its copies went with the namespaces' twins there, and its record goes with the
        peering (a cluster peered again under this id starts with nothing)."""
        with self._lock:
            self.held.pop(cluster, None)
            self.ever.pop(cluster, None)
            self._sent = {sent for sent in self._sent if sent[0] != cluster}

    def lookup(self, api: Api) -> Callable[[Mapping[str, Any]], Lookup | None]:
        """The kubelet's view for a pod on a virtual node: a Secret or ConfigMap exists for it only if Liqo's
        rules copy it to that donor, so a pod whose Secret Liqo would not copy there waits as it would on the
        donor; None for an origin node. Judged when the kubelet looks (no reflection lag), by the same rules as
        :meth:`sync`."""
        def view(pod: Mapping[str, Any]) -> Lookup | None:
            node = api.find(api.type("", "v1", "nodes"), "", (pod.get("spec") or {}).get("nodeName") or "")
            if node is None or not is_virtual_node(node):
                return None
            cluster = node["metadata"]["labels"].get(REMOTE_CLUSTER_ID_LABEL)
            namespace = str(pod["metadata"]["namespace"])

            def find(kind: str, name: str) -> dict[str, Any] | None:
                nsoff = api.find(api.kind(*offloading_kind()), namespace, offloading.NAMESPACE_OFFLOADING_NAME)
                if cluster not in offloaded_to([nsoff] if nsoff else [], [node]).get(namespace, []):
                    return None
                obj = api.find(api.type("", "v1", kind), namespace, name)
                return obj if obj is not None and reflected(obj, KINDS[("", kind)], self.types) else None
            return find
        return view


def offloading_kind() -> tuple[str, str]:
    return ("offloading.liqo.io/v1beta1", "NamespaceOffloading")


async def reflection_controller(api: Api, copies: DonorCopies) -> None:
    """Keep ``copies`` in line on every change of a Secret, ConfigMap, NamespaceOffloading or Node; never returns."""
    watched = {*KINDS, api.kind(*offloading_kind()).key, ("", "nodes")}
    _, rv = api.store.list(("", "nodes"))
    copies.sync(api)
    sub = api.store.subscribe(None, since=rv)
    try:
        async for event in sub:
            if event.key in KINDS and event.type != "DELETED":
                copies.sync(api, [(KINDS[event.key], event.object)])
            elif event.key in watched:
                copies.sync(api)
    finally:
        sub.close()
