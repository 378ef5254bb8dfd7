"""Pure builders of the Kueue objects that follow the Liqo inventory: no network here, only dicts in API shape.

With queueing on, Kueue decides which queued pod runs and on which donor. The project describes the pool
to it: one ResourceFlavor per donor and GPU model (its ``nodeLabels`` select that donor's virtual nodes, its
``tolerations`` carry Liqo's taint so Kueue adds them to the pod it admits), one ClusterQueue whose
per-flavor quota is what the donor granted, cheapest flavor first, a LocalQueue per user namespace and the
WorkloadPriorityClasses users choose from. ``queue_sync`` turns the difference from what exists into writes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import labels as L
from .inventory import Inventory
from .trust import TrustPolicy

MAX_FLAVORS = 64
"""Kueue's limit on flavors in one resource group (the CRD's maxItems)."""
COVERED_RESOURCES = ("cpu", "memory", L.GPU_RESOURCE)
"""What runner pods request: Kueue admits a pod only when its ClusterQueue covers every resource it asks for."""
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class PriorityClass:
    """One WorkloadPriorityClass users may name with ``--priority``."""

    name: str
    value: int
    """Higher is admitted first and may preempt lower ones within the ClusterQueue."""
    description: str = ""
    users: tuple[str, ...] = ()
    """Hub users who may use it; with ``groups`` both empty, everyone may."""
    groups: tuple[str, ...] = ()
    """Hub groups whose members may use it."""

    def open_to(self, user: str, groups: tuple[str, ...] | list[str] = ()) -> bool:
        """Whether ``user`` (a member of ``groups``) may name this class."""
        if not self.users and not self.groups:
            return True
        return user in self.users or any(g in self.groups for g in groups)


DEFAULT_PRIORITY_CLASSES = (
    PriorityClass("interactive", 1000, "Notebook cells and sessions someone is waiting for"),
    PriorityClass("batch", 100, "Work nobody watches; preempted by interactive runs when the pool is full"),
)


@dataclass(frozen=True)
class QueueSettings:
    """The queueing part of the configuration (chart values ``queueing.kueue``)."""

    cluster_queue: str = "gpu-offload"
    """Name of the one ClusterQueue over all donors."""
    local_queue: str = "gpu-offload"
    """Name of the LocalQueue in each user namespace (what ``GPU_OFFLOAD_QUEUE`` names)."""
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    default_priority: str = "interactive"
    """Priority class of runs that name none."""
    session_protection: int = 0
    """Seconds a notebook session's pod is protected from preemption after its runner starts (the chart's
    ``queueing.kueue.sessionProtection``); 0: none."""
    protected_priority: str = "session-protected"
    """The class a protected session pod runs at meanwhile (``queueing.kueue.protectedPriorityClass``): one of
    ``priority_classes`` above every other when the protection is on."""

    def allowed(self, user: str, groups: tuple[str, ...] | list[str] = ()) -> tuple[str, ...]:
        """The classes ``user`` may name (the chart's ``users``/``groups`` of each), in the configured order."""
        return tuple(c.name for c in self.priority_classes if c.open_to(user, groups))


@dataclass(frozen=True)
class FlavorSupply:
    """What one donor grants of one GPU model: the facts a ResourceFlavor and its quota are built from."""

    name: str
    cluster_id: str
    model: str | None
    node_labels: Mapping[str, str]
    price: float | None
    gpus: int
    """GPUs granted on usable nodes (0 when the donor is cordoned, down or its nodes are not ready)."""
    cpu: int
    """Millicores granted on usable nodes."""
    memory: int
    """Bytes granted on usable nodes."""
    devices: tuple[tuple[str, int], ...] = ()
    """Units of the other ``nvidia.com/`` resources granted on usable nodes: time-slicing or MPS shares, MIG
    profiles, an isolator's MiB (docs/sharing.md), so parts of GPUs queue like whole ones."""


@dataclass(frozen=True)
class Desired:
    """Every Kueue object the pool should have, and what could not be expressed."""

    flavors: tuple[dict[str, Any], ...]
    cluster_queue: dict[str, Any]
    priority_classes: tuple[dict[str, Any], ...]
    local_queues: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = field(default=())


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _dns_subdomain(text: str) -> str:
    """``text`` lowercased as a DNS subdomain: unchanged when it then is one, else cleaned plus a short hash."""
    if len(text) <= 253 and _DNS_SUBDOMAIN.match(text.lower()):
        return text.lower()
    digest = _digest(text)
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", text.lower())[:240].strip("-.")
    return f"{cleaned}-{digest}" if cleaned else digest


def flavor_name(cluster_id: str, model: str | None) -> str:
    """The ResourceFlavor of one donor's GPUs of one model (``any`` for nodes without a model label), e.g.
    ``gpuo-donor-1-a100``."""
    return _dns_subdomain(f"gpuo-{cluster_id}-{model or 'any'}")


def _unique(name: str, key: str, taken: set[str]) -> str:
    # models differing only in case ("A100", "a100") lowercase to one name; Kueue refuses a flavor twice
    return f"{name[:244]}-{_digest(key)}" if name in taken else name


def _cpu(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def _memory(size: int) -> str:
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def flavor_supplies(inventory: Inventory, policy: TrustPolicy) -> list[FlavorSupply]:
    """One supply per donor and GPU model, cheapest first (unknown prices last, then by name).

    Where the origin's admin set a cluster's model (``policy``), that model covers all its virtual nodes and
    the flavor selects on the cluster id alone: the nodes' own model labels may say anything. Otherwise the
    flavor also selects on the model label, so two models of one donor are two flavors.
    """
    groups: dict[tuple[str, str | None], list[Any]] = {}
    overridden: set[str] = set()
    healthy: dict[str, bool] = {}
    for cluster in inventory.clusters:
        healthy[cluster.cluster_id] = cluster.health != "down"
        if policy.for_cluster(cluster.cluster_id).gpu_model is not None:
            overridden.add(cluster.cluster_id)
        for vn in cluster.virtual_nodes:
            groups.setdefault((cluster.cluster_id, vn.model), []).append(vn)
    supplies = []
    taken: set[str] = set()
    for (cluster_id, model), nodes in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        labels = {L.REMOTE_CLUSTER_ID_LABEL: cluster_id}
        if model is not None and cluster_id not in overridden:
            labels[L.GPU_MODEL] = model
        usable = [vn for vn in nodes if healthy[cluster_id] and vn.ready and not vn.cordoned]
        prices = [vn.price for vn in nodes if vn.price is not None]
        name = _unique(flavor_name(cluster_id, model), f"{cluster_id}/{model}", taken)
        taken.add(name)
        devices: dict[str, int] = {}
        for vn in usable:
            for resource, allocatable, _ in vn.devices:
                devices[resource] = devices.get(resource, 0) + allocatable
        supplies.append(FlavorSupply(
            name=name, cluster_id=cluster_id, model=model, node_labels=labels,
            price=min(prices) if prices else None,
            # nvidia.com/gpu as the nodes offer it: under a memory isolator its units are slots of a GPU
            gpus=devices.pop(L.GPU_RESOURCE) if L.GPU_RESOURCE in devices else sum(vn.allocatable for vn in usable),
            cpu=sum(vn.cpu_allocatable or 0 for vn in usable),
            memory=sum(vn.memory_allocatable or 0 for vn in usable),
            devices=tuple(sorted(devices.items())),
        ))
    return sorted(supplies, key=lambda s: (s.price is None, s.price or 0.0, s.name))


def _managed() -> dict[str, str]:
    return {L.MANAGED_BY: L.MANAGED_BY_VALUE}


def resource_flavor(supply: FlavorSupply) -> dict[str, Any]:
    """The ResourceFlavor of ``supply``: Kueue copies its nodeLabels (as a node selector) and tolerations onto
    the pods it admits there, so the pod reaches the virtual node without the project adding either."""
    annotations = {L.REMOTE_CLUSTER_ID_LABEL: supply.cluster_id}
    if supply.model is not None:
        annotations[L.GPU_MODEL] = supply.model
    return {
        "apiVersion": L.RESOURCE_FLAVOR.api_version,
        "kind": L.RESOURCE_FLAVOR.kind,
        "metadata": {"name": supply.name, "labels": _managed(), "annotations": annotations},
        "spec": {
            "nodeLabels": dict(supply.node_labels),
            "tolerations": [{"key": L.VIRTUAL_NODE_TAINT_KEY, "operator": "Exists",
                             "effect": L.VIRTUAL_NODE_TAINT_EFFECT}],
        },
    }


def covered_resources(supplies: Iterable[FlavorSupply]) -> tuple[str, ...]:
    """What the ClusterQueue covers: what runner pods request, and every shared GPU resource a donor offers.
    Kueue wants one list for all flavors of a group, so a flavor lacking one has a quota of 0 for it."""
    shared = sorted({r for s in supplies for r, _ in s.devices} - set(COVERED_RESOURCES))
    return (*COVERED_RESOURCES, *shared)


def _flavor_quota(supply: FlavorSupply, covered: tuple[str, ...]) -> dict[str, Any]:
    quota = {"cpu": _cpu(supply.cpu), "memory": _memory(supply.memory), L.GPU_RESOURCE: str(supply.gpus),
             **{r: str(n) for r, n in supply.devices}}
    return {"name": supply.name, "resources": [{"name": r, "nominalQuota": quota.get(r, "0")} for r in covered]}


def cluster_queue(settings: QueueSettings, supplies: Iterable[FlavorSupply]) -> dict[str, Any]:
    """The ClusterQueue over ``supplies`` (in their order: Kueue tries flavors first to last).

    Admission Fair Sharing orders the LocalQueues of users by their recent usage, so a long backlog of one
    user does not starve the others; a higher priority preempts a lower one inside this queue only; only
    namespaces the hub made for users may queue here.
    """
    supplies = list(supplies)
    covered = covered_resources(supplies)
    flavors = [_flavor_quota(s, covered) for s in supplies]
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {L.USER_NAMESPACE: "true"}},
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "admissionScope": {"admissionMode": "UsageBasedAdmissionFairSharing"},
        # Kueue needs at least one flavor per group: with no donor there is no group, and nothing is admitted.
        "resourceGroups": [{"coveredResources": list(covered), "flavors": flavors}] if flavors else [],
    }
    return {
        "apiVersion": L.CLUSTER_QUEUE.api_version,
        "kind": L.CLUSTER_QUEUE.kind,
        "metadata": {"name": settings.cluster_queue, "labels": _managed()},
        "spec": spec,
    }


def local_queue(namespace: str, settings: QueueSettings) -> dict[str, Any]:
    """The LocalQueue of one user namespace: its pods name it in ``kueue.x-k8s.io/queue-name``."""
    return {
        "apiVersion": L.LOCAL_QUEUE.api_version,
        "kind": L.LOCAL_QUEUE.kind,
        "metadata": {"name": settings.local_queue, "namespace": namespace, "labels": _managed()},
        "spec": {"clusterQueue": settings.cluster_queue},
    }


def priority_class(entry: PriorityClass) -> dict[str, Any]:
    """One WorkloadPriorityClass (cluster-scoped: any namespace's runs may name it)."""
    return {
        "apiVersion": L.WORKLOAD_PRIORITY_CLASS.api_version,
        "kind": L.WORKLOAD_PRIORITY_CLASS.kind,
        "metadata": {"name": entry.name, "labels": _managed()},
        "value": entry.value,
        "description": entry.description,
    }


def desired(inventory: Inventory, policy: TrustPolicy, settings: QueueSettings,
            namespaces: Iterable[str] = ()) -> Desired:
    """Everything the pool should have for ``inventory``, plus LocalQueues in ``namespaces``."""
    supplies = flavor_supplies(inventory, policy)
    warnings: tuple[str, ...] = ()
    if len(supplies) > MAX_FLAVORS:
        left = ", ".join(s.name for s in supplies[MAX_FLAVORS:])
        warnings = (f"Kueue takes at most {MAX_FLAVORS} flavors in a ClusterQueue; the most expensive are left out "
                    f"of {settings.cluster_queue}: {left}",)
        supplies = supplies[:MAX_FLAVORS]
    return Desired(
        flavors=tuple(resource_flavor(s) for s in supplies),
        cluster_queue=cluster_queue(settings, supplies),
        priority_classes=tuple(priority_class(p) for p in settings.priority_classes),
        local_queues=tuple(local_queue(ns, settings) for ns in sorted(set(namespaces))),
        warnings=warnings,
    )


def _object_name(value: Any, where: str, label: bool = False) -> str:
    """``value`` if it is an object name; ``label``: also a label value (pods name it in a label)."""
    longest = 63 if label else 253
    if (not isinstance(value, str) or len(value) > longest or not _DNS_SUBDOMAIN.match(value)
            or (label and "." in value)):
        allowed = "'-'" if label else "'-' and '.'"
        raise ValueError(f"{where}={value!r} is not a name pods can carry in a label: use lowercase letters, "
                         f"digits and {allowed}, at most {longest} characters")
    return value


def _priority_classes(raw: Any, where: str) -> tuple[PriorityClass, ...]:
    if raw is None:
        return DEFAULT_PRIORITY_CLASSES
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where} must be a list like [{{name: interactive, value: 1000}}], got {raw!r}")
    classes = []
    for i, entry in enumerate(raw):
        here = f"{where}[{i}]"
        if not isinstance(entry, Mapping) or set(entry) - {"name", "value", "description", "users", "groups"}:
            raise ValueError(f"{here} must be a mapping of name, value, description, users and groups, got {entry!r}")
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{here}.value={value!r} must be a whole number (higher is admitted first)")
        classes.append(PriorityClass(_object_name(entry.get("name"), f"{here}.name", label=True), value,
                                     str(entry.get("description") or ""), _names(entry.get("users"), f"{here}.users"),
                                     _names(entry.get("groups"), f"{here}.groups")))
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"{where} names a class twice: {', '.join(names)}")
    return tuple(classes)


def _names(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise ValueError(f"{where} must be a list of hub user or group names, got {raw!r}")
    return tuple(raw)


def queue_settings(raw: Mapping[str, Any] | None, where: str = "queueing.kueue") -> QueueSettings:
    """QueueSettings from the chart's ``queueing.kueue`` value (camelCase keys); raises ``ValueError`` naming
    the key that does not fit."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(raw).__name__}")
    base = QueueSettings()
    classes = _priority_classes(raw.get("priorityClasses"), f"{where}.priorityClasses")
    default = str(raw.get("defaultPriority") or base.default_priority)
    if default not in {c.name for c in classes}:
        raise ValueError(f"{where}.defaultPriority={default!r} is not one of the priority classes "
                         f"({', '.join(c.name for c in classes)})")
    if any(c.name == default and (c.users or c.groups) for c in classes):
        raise ValueError(f"{where}.defaultPriority={default!r} is open to some users only, but every run that "
                         "names no class gets it: drop its users and groups, or make another class the default")
    local = _object_name(raw.get("localQueue") or base.local_queue, f"{where}.localQueue", label=True)
    if local == "default":
        # Kueue's default-LocalQueue feature queues every pod of a namespace that names no queue in a
        # LocalQueue called "default": the user's own server and every pod they start would wait in the pool.
        raise ValueError(f"{where}.localQueue='default' would make Kueue queue every unlabelled pod of each user "
                         "namespace, the user's own server included: pick another name (the default is "
                         f"{base.local_queue!r})")
    protection = raw.get("sessionProtection", base.session_protection)
    if isinstance(protection, bool) or not isinstance(protection, int) or protection < 0:
        raise ValueError(f"{where}.sessionProtection={protection!r} must be a whole number of seconds, 0 for none")
    protected = _object_name(raw.get("protectedPriorityClass") or base.protected_priority,
                             f"{where}.protectedPriorityClass", label=True)
    if protection:
        classes = _with_protected(classes, protected, default, f"{where}.protectedPriorityClass")
    return QueueSettings(
        cluster_queue=_object_name(raw.get("clusterQueue") or base.cluster_queue, f"{where}.clusterQueue"),
        local_queue=local,
        priority_classes=classes,
        default_priority=default,
        session_protection=protection,
        protected_priority=protected,
    )


def _with_protected(classes: tuple[PriorityClass, ...], name: str, default: str,
                    where: str) -> tuple[PriorityClass, ...]:
    """``classes`` with the protected sessions' class: added one above the highest, or the admin's own if listed,
    which must then be above every other (else a class could preempt a protected session) and open to everyone
    (every user's session pods start at it)."""
    others = [c for c in classes if c.name != name]
    top = max(c.value for c in others) if others else 0
    if name == default:
        raise ValueError(f"{where}={name!r} is the default priority: every run would be protected; name another "
                         "class")
    mine = next((c for c in classes if c.name == name), None)
    if mine is None:
        return (*classes, PriorityClass(name, top + 1, "Notebook sessions in their first minutes (protected from "
                                        "preemption; only the kernel names it)"))
    if mine.value <= top:
        raise ValueError(f"{where}={name!r} has value {mine.value}, not above every other class (the highest is "
                         f"{top}): a run of that class could preempt a protected session; raise it or leave the "
                         "class out of priorityClasses (the hub then adds it one above the highest)")
    if mine.users or mine.groups:
        raise ValueError(f"{where}={name!r} is open to some users only, but every user's session pods start at it: "
                         "drop its users and groups")
    return classes


def model_clusters(inventory: Inventory, policy: TrustPolicy, models: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each cluster having a GPU of one of ``models`` (any case) -> the model label values its flavors select
    on: the models as its nodes spell them, or ``()`` where the admin set the cluster's model (its flavor
    selects on the cluster id alone, and its nodes' own labels may say anything). ``inventory`` has the policy
    applied (``trust.apply_policy``)."""
    wanted = {m.lower() for m in models}
    found: dict[str, set[str]] = {}
    for cluster in inventory.clusters:
        for vn in cluster.virtual_nodes:
            if vn.model is not None and vn.model.lower() in wanted:
                found.setdefault(cluster.cluster_id, set()).add(vn.model)
    return {cluster_id: () if policy.for_cluster(cluster_id).gpu_model is not None else tuple(sorted(spelt))
            for cluster_id, spelt in sorted(found.items())}


def queued_scheduling(gpus: int, clusters: Iterable[str] = (),
                      models: Mapping[str, tuple[str, ...]] | None = None,
                      limits: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The scheduling fields of a runner pod that waits in Kueue: the GPUs it asks for, and node affinity only
    where the run narrows the donors (a ``--cluster`` pin, trusted clusters only, GPU models). No toleration
    and no node choice: Kueue picks a flavor that matches the affinity and adds that flavor's node labels and
    tolerations when it admits the pod (``resource_flavor``).

    A model request (``models``, from :func:`model_clusters`) is narrowed by cluster id, a key every flavor
    carries: one node-selector term per cluster having the model, adding the model key only where that
    cluster's flavors select on it. Kueue 0.19 and later match a flavor on the keys in its own ``nodeLabels``
    only, so a model key alone would match every flavor that selects on the cluster id alone (an admin-set
    model, nodes without a model label) and Kueue would admit the pod where the scheduler cannot bind it.
    ``clusters`` and ``models`` both given: the clusters in both. ``limits``: part of a GPU, asked for in the
    resources of the donors given in ``clusters`` (``shares.queued_ask``), instead of ``gpus`` whole GPUs."""
    asked = {r: str(n) for r, n in limits.items()} if limits else {L.GPU_RESOURCE: str(gpus)}
    fragment: dict[str, Any] = {"resources": {"limits": asked}}
    pinned = sorted(set(clusters))
    terms: list[dict[str, Any]] = []
    if models is not None:
        for cluster_id, spelt in models.items():
            if pinned and cluster_id not in pinned:
                continue
            exprs = [{"key": L.REMOTE_CLUSTER_ID_LABEL, "operator": "In", "values": [cluster_id]}]
            if spelt:
                exprs.append({"key": L.GPU_MODEL, "operator": "In", "values": list(spelt)})
            terms.append({"matchExpressions": exprs})
        if not terms:
            raise ValueError("no cluster offers the GPU model asked for" + (" among " + ", ".join(pinned)
                                                                            if pinned else ""))
    elif pinned:
        terms.append({"matchExpressions": [{"key": L.REMOTE_CLUSTER_ID_LABEL, "operator": "In", "values": pinned}]})
    if terms:
        fragment["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    return fragment


def gpu_quotas(cluster_queue: Mapping[str, Any]) -> dict[str, int]:
    """Flavor name -> nominal GPU quota, as the ClusterQueue says (flavors without a GPU quota hold none)."""
    quotas: dict[str, int] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                if resource.get("name") == L.GPU_RESOURCE:
                    try:
                        quotas[str(flavor.get("name"))] = int(str(resource.get("nominalQuota")))
                    except ValueError:
                        quotas[str(flavor.get("name"))] = 0
    return quotas
