"""Inventory records and the pure functions that build them from API objects.

Inputs are plain dicts exactly as the API returns them (camelCase keys), so the same functions serve the
direct client, the watch cache and the hub's user-scoped API. Nothing here touches the network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from kubernetes.utils import parse_quantity

from . import labels as L
from .sharing import GPU_VENDOR, GpuOffer, offer_from_node
from .untrusted_text import shown

KINDS = ("ForeignCluster", "VirtualNode", "Node", "Pod")
"""The API kinds the inventory is built from (listed and watched by ``client`` and ``cache``)."""
Health = Literal["healthy", "degraded", "down"]
Obj = Mapping[str, Any]

# Condition states from the ForeignCluster CRD: good ones, ones still converging, failed ones.
_GOOD = {"Established", "Ready"}
_FAILED = {"Error", "NotReady"}
# Without authentication the virtual kubelet cannot reach the donor, without offloading there is no node:
# either failing means no pod can run there. Networking only affects pod-to-pod traffic, not logs.
_VITAL_MODULES = ("offloading", "authentication")
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases after which a pod holds nothing: its GPUs are free again, and its run can be billed."""


@dataclass(frozen=True)
class VirtualNodeRecord:
    """One Liqo virtual node and its GPUs as placement sees them."""

    name: str
    cluster_id: str
    capacity: int
    """GPUs the node reports (``status.capacity``), or the VirtualNode's quota when no Node exists yet."""
    allocatable: int
    in_use: int
    """GPUs requested by pods bound to this node that have not finished."""
    model: str | None = None
    memory: str | None = None
    """Memory of one GPU as the admin labelled it, e.g. ``80Gi``."""
    price: float | None = None
    """Price of one GPU-hour set by the admin; None when unknown."""
    cordoned: bool = False
    ready: bool = True
    cpu_free: int | None = None
    """Millicores a new pod can still request here (allocatable minus bound pods' requests); None: unknown."""
    memory_free: int | None = None
    """Bytes of memory a new pod can still request here; None: unknown."""
    cpu_allocatable: int | None = None
    """Millicores the donor granted this node (the Node's allocatable, else the VirtualNode's quota); None: unknown."""
    memory_allocatable: int | None = None
    """Bytes of memory the donor granted this node, read like ``cpu_allocatable``; None: unknown."""
    sharing: str = "none"
    """How the donor lends these GPUs (``labels.GPU_SHARING``): none, time-slicing, mps, mig or memory."""
    replicas: int = 1
    """Shares per GPU under time-slicing or MPS (``labels.GPU_REPLICAS``)."""
    devices: tuple[tuple[str, int, int], ...] = ()
    """Every ``nvidia.com/`` resource of the node (whole GPUs, shares, MIG profiles, an isolator's MiB):
    (resource, allocatable, requested by unfinished pods)."""
    free: int = field(init=False)
    """GPUs that a new pod can still get here (allocatable minus in use); stored, placement reads it a lot."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "free", max(0, self.allocatable - self.in_use))
        # a record read back from JSON (the hub's inventory) has lists here
        object.__setattr__(self, "devices", tuple((str(r), int(a), int(u)) for r, a, u in self.devices))

    def device_free(self, resource: str) -> int:
        """Units of ``resource`` a new pod can still get here (0 when the node does not offer it)."""
        return next((max(0, a - u) for r, a, u in self.devices if r == resource), 0)

    def offer(self) -> GpuOffer:
        """How this node lends its GPUs, for ``sharing.resource_ask``."""
        memory = _bytes(self.memory, self.name) if self.memory else None
        labels = {L.GPU_SHARING: self.sharing, L.GPU_REPLICAS: str(self.replicas)}
        return offer_from_node(labels, (r for r, _, _ in self.devices), memory, f"virtual node {self.name}")


@dataclass(frozen=True)
class ClusterRecord:
    """A peered cluster (one ForeignCluster) and the virtual nodes that lead to it."""

    cluster_id: str
    name: str
    role: str
    health: Health
    reason: str = ""
    """Why the cluster is not healthy, naming the failing module and condition; empty when healthy."""
    virtual_nodes: tuple[VirtualNodeRecord, ...] = ()
    trusted: bool = False
    """Whether the origin trusts this cluster with its users' kernels: set by ``trust.apply_policy`` from
    origin-side configuration only, never from the cluster's objects (a donor's labels reach them)."""

    @property
    def gpus_free(self) -> int:
        """Free GPUs over the cluster's usable virtual nodes."""
        return sum(vn.free for vn in self.virtual_nodes if vn.ready and not vn.cordoned)


@dataclass(frozen=True)
class Inventory:
    """Every peered cluster with its virtual nodes: what ``gpu-offload clusters`` shows (``render`` draws it as
    a table, ``magics.cluster_commands`` shows it in a notebook)."""

    clusters: tuple[ClusterRecord, ...] = ()
    errors: tuple[str, ...] = field(default=())
    """Objects that could not be read (malformed labels, ...), each naming the object: shown, never fatal."""

    def cluster(self, key: str) -> ClusterRecord | None:
        """The cluster whose id or ForeignCluster name is ``key``."""
        return next((c for c in self.clusters if key in (c.cluster_id, c.name)), None)

    @property
    def virtual_nodes(self) -> tuple[VirtualNodeRecord, ...]:
        """All virtual nodes of all clusters."""
        return tuple(vn for c in self.clusters for vn in c.virtual_nodes)


def _conditions(holder: Obj | None) -> list[Obj]:
    return list((holder or {}).get("conditions") or [])


def _describe(prefix: str, cond: Obj) -> str:
    text = f"{prefix}{cond.get('type')}={cond.get('status')}"
    detail = cond.get("message") or cond.get("reason")  # Liqo's words, partly about the remote cluster
    return f"{text} ({shown(detail)})" if detail else text


def cluster_health(foreign_cluster: Obj) -> tuple[Health, str]:
    """Health of a peered cluster from its ForeignCluster status, and the condition that made it so.

    ``down``: a vital module (offloading, authentication) is disabled or has a failed condition, or the
    API server condition failed. ``degraded``: anything else is failed or still converging.
    """
    status = foreign_cluster.get("status") or {}
    modules = status.get("modules") or {}
    down: list[str] = []
    degraded: list[str] = []
    for cond in _conditions(status):
        state = cond.get("status")
        if state in _GOOD:
            continue
        bucket = down if cond.get("type") == "APIServerStatus" and state in _FAILED else degraded
        bucket.append(_describe("", cond))
    for module in ("offloading", "authentication", "networking"):
        spec = modules.get(module) or {}
        vital = module in _VITAL_MODULES
        if not spec.get("enabled", False):
            if vital:
                down.append(f"{module} module disabled")
            continue
        for cond in _conditions(spec):
            state = cond.get("status")
            if state in _GOOD:
                continue
            bucket = down if vital and state in _FAILED else degraded
            bucket.append(_describe(f"{module}/", cond))
    if down:
        return "down", "; ".join(down)
    if degraded:
        return "degraded", "; ".join(degraded)
    return "healthy", ""


def _count(value: Any, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)  # the common case; parse_quantity's Decimal arithmetic costs 20x more
    try:
        return int(parse_quantity(value))
    except ValueError as exc:
        raise ValueError(f"{what}: {value!r} is not a quantity") from exc


def pod_gpus(pod: Obj) -> int:
    """GPUs a pod holds, counted as the Kubernetes scheduler counts a pod's requests (component-helpers'
    ``PodRequests``): the containers' sum plus every sidecar's (an init container with ``restartPolicy:
    Always`` runs, and holds its GPUs, for the pod's life), or, if more, what one init container needs while
    it runs beside the sidecars started before it."""
    spec = pod.get("spec") or {}

    def gpus(container: Obj) -> int:
        res = container.get("resources") or {}
        limit = (res.get("limits") or {}).get(L.GPU_RESOURCE)
        request = (res.get("requests") or {}).get(L.GPU_RESOURCE)
        return _count(limit if limit is not None else request, "nvidia.com/gpu")

    running = sum(gpus(c) for c in spec.get("containers") or [])
    sidecars = init_peak = 0
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            running += gpus(container)
            sidecars += gpus(container)
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, gpus(container) + sidecars)
    return max(running, init_peak)


def pod_devices(pod: Obj) -> dict[str, int]:
    """Units of every ``nvidia.com/`` resource a pod's containers ask for (limits, else requests), summed; an
    init container counts when it asks for more than the containers. Unparsable values count as zero."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}

    def of(container: Obj) -> dict[str, int]:
        res = container.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        found: dict[str, int] = {}
        for key, value in merged.items():
            if str(key).startswith(GPU_VENDOR):
                try:
                    found[key] = _count(value, key)
                except ValueError:
                    continue
        return found

    for container in spec.get("containers") or []:
        for key, count in of(container).items():
            total[key] = total.get(key, 0) + count
    for container in spec.get("initContainers") or []:
        for key, count in of(container).items():
            total[key] = max(total.get(key, 0), count)
    return total


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _milli(value: Any, what: str) -> int:
    text = str(value)
    if text.isdigit():  # the common spellings first: parse_quantity's Decimal arithmetic costs 20x more
        return int(text) * 1000
    if text.endswith("m") and text[:-1].isdigit():
        return int(text[:-1])
    try:
        return int(parse_quantity(value) * 1000)
    except ValueError as exc:
        raise ValueError(f"{what}: {value!r} is not a CPU quantity") from exc


def _bytes(value: Any, what: str) -> int:
    text = str(value)
    if text.isdigit():
        return int(text)
    if text[-2:] in _BINARY and text[:-2].isdigit():
        return int(text[:-2]) * _BINARY[text[-2:]]
    try:
        return int(parse_quantity(value))
    except ValueError as exc:
        raise ValueError(f"{what}: {value!r} is not a memory quantity") from exc


def _container_requests(container: Obj) -> tuple[int, int]:
    res = container.get("resources")
    if not res:
        return 0, 0
    requests = res.get("requests") or {}
    limits = res.get("limits") or {}
    cpu = requests.get("cpu", limits.get("cpu"))
    memory = requests.get("memory", limits.get("memory"))
    try:
        return (_milli(cpu, "cpu") if cpu is not None else 0), (_bytes(memory, "memory") if memory is not None else 0)
    except ValueError:
        return 0, 0


def pod_requests(pod: Obj) -> tuple[int, int]:
    """CPU millicores and memory bytes the scheduler reserves for a pod: the containers' requests summed
    (a limit stands in for a missing request, as the API server defaults it), or the largest init container's
    if that is more. Unparsable values count as zero: the pod was admitted, so the API server accepted them."""
    spec = pod.get("spec") or {}
    cpu = memory = 0
    for container in spec.get("containers") or ():
        c, m = _container_requests(container)
        cpu += c
        memory += m
    for container in spec.get("initContainers") or ():
        c, m = _container_requests(container)
        cpu, memory = max(cpu, c), max(memory, m)
    return cpu, memory


@dataclass
class NodeUsage:
    """What the unfinished pods bound to one node hold."""

    gpus: int = 0
    cpu: int = 0
    """Millicores requested."""
    memory: int = 0
    """Bytes requested."""
    devices: dict[str, int] = field(default_factory=dict)
    """Units of each ``nvidia.com/`` resource requested (shares, MIG profiles, an isolator's MiB, GPUs)."""


def usage_by_node(pods: Iterable[Obj]) -> dict[str, NodeUsage]:
    """GPUs, CPU and memory held per node name by the pods bound to it that are not finished."""
    used: dict[str, NodeUsage] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        usage = used.setdefault(node, NodeUsage())
        usage.gpus += pod_gpus(pod)
        for resource, count in pod_devices(pod).items():
            usage.devices[resource] = usage.devices.get(resource, 0) + count
        cpu, memory = pod_requests(pod)
        usage.cpu += cpu
        usage.memory += memory
    return used


def gpus_in_use(pods: Iterable[Obj]) -> dict[str, int]:
    """GPUs held per node name by the pods bound to it that are not finished."""
    return {node: usage.gpus for node, usage in usage_by_node(pods).items()}


def _meta(obj: Obj | None, key: str) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get(key) or {}


def _price(raw: str | None, where: str) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{where}: {L.PRICE_PER_GPU_HOUR}={raw!r} is not a number; set it like '2.5'") from None
    if value < 0:
        raise ValueError(f"{where}: {L.PRICE_PER_GPU_HOUR}={raw!r} is negative")
    return value


def _node_ready(node: Obj) -> bool:
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def virtual_node_record(node: Obj | None, virtual_node: Obj | None, used: int | NodeUsage) -> VirtualNodeRecord:
    """One record from the Node Liqo created and/or its VirtualNode (either may be missing, not both).

    ``used`` is what the node's pods hold (or just their GPUs); CPU and memory free are known only from a Node.

    The Node is what the scheduler sees, so it wins; the VirtualNode's ``spec.labels`` stand in for labels
    not yet reflected on the Node, and its quota for capacity before the Node exists.
    """
    if node is None and virtual_node is None:
        raise ValueError("virtual_node_record needs a Node or a VirtualNode")
    vspec = (virtual_node or {}).get("spec") or {}
    merged_labels = {**_meta(virtual_node, "labels"), **(vspec.get("labels") or {}), **_meta(node, "labels")}
    merged_notes = {**_meta(virtual_node, "annotations"), **_meta(node, "annotations")}
    name = str(((node or virtual_node) or {}).get("metadata", {}).get("name"))
    # the VirtualNode's clusterID first: Liqo copies a donor's own labels onto the Node, and trust is per cluster
    cluster_id = vspec.get("clusterID") or merged_labels.get(L.REMOTE_CLUSTER_ID_LABEL) or ""
    where = f"virtual node {name}"
    usage = used if isinstance(used, NodeUsage) else NodeUsage(gpus=used)
    cpu_free = memory_free = cpu_granted = memory_granted = None
    if node is not None:
        nstatus = node.get("status") or {}
        capacity = _count((nstatus.get("capacity") or {}).get(L.GPU_RESOURCE), where)
        node_allocatable = nstatus.get("allocatable") or {}
        allocatable = _count(node_allocatable.get(L.GPU_RESOURCE), where)
        offered = node_allocatable
        if "cpu" in node_allocatable:
            cpu_granted = _milli(node_allocatable["cpu"], where)
            cpu_free = max(0, cpu_granted - usage.cpu)
        if "memory" in node_allocatable:
            memory_granted = _bytes(node_allocatable["memory"], where)
            memory_free = max(0, memory_granted - usage.memory)
        ready = _node_ready(node)
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    else:
        hard = (vspec.get("resourceQuota") or {}).get("hard") or {}
        capacity = _count(hard.get(L.GPU_RESOURCE), where)
        allocatable, ready, unschedulable = capacity, False, False
        offered = hard
        cpu_granted = _milli(hard["cpu"], where) if "cpu" in hard else None
        memory_granted = _bytes(hard["memory"], where) if "memory" in hard else None
    cordon_flag = merged_labels.get(L.CORDONED, merged_notes.get(L.CORDONED, ""))
    devices = tuple((str(r), _count(v, where), usage.devices.get(str(r), 0))
                    for r, v in sorted(offered.items()) if str(r).startswith(GPU_VENDOR))
    memory_label = merged_labels.get(L.GPU_MEMORY)
    offer = offer_from_node(merged_labels, (r for r, _, _ in devices),
                            _bytes(memory_label, where) if memory_label else None, where)
    if not lends_whole(offer):
        capacity = allocatable = 0  # what it offers under nvidia.com/gpu are shares or slots, not whole GPUs
    return VirtualNodeRecord(
        name=name,
        cluster_id=cluster_id,
        capacity=capacity,
        allocatable=allocatable,
        in_use=usage.gpus,
        model=merged_labels.get(L.GPU_MODEL),
        memory=merged_labels.get(L.GPU_MEMORY),
        price=_price(merged_labels.get(L.PRICE_PER_GPU_HOUR, merged_notes.get(L.PRICE_PER_GPU_HOUR)), where),
        cordoned=unschedulable or cordon_flag.lower() == "true",
        ready=ready,
        cpu_free=cpu_free,
        memory_free=memory_free,
        cpu_allocatable=cpu_granted,
        memory_allocatable=memory_granted,
        sharing=offer.mode,
        replicas=offer.replicas,
        devices=devices,
    )


def lends_whole(offer: GpuOffer) -> bool:
    """Whether ``nvidia.com/gpu`` on such a node counts whole GPUs: not when time-slicing or MPS shares keep
    its name (one unit is one share), nor under a memory isolator (one unit is one slot of a GPU)."""
    if offer.mode in ("time-slicing", "mps"):
        return offer.resource != L.GPU_RESOURCE
    return offer.mode != "memory"


def _is_virtual(node: Obj) -> bool:
    return _meta(node, "labels").get(L.TYPE_LABEL) == L.TYPE_VIRTUAL_NODE


def build_inventory(
    foreign_clusters: Iterable[Obj],
    virtual_nodes: Iterable[Obj] = (),
    nodes: Iterable[Obj] = (),
    pods: Iterable[Obj] = (),
) -> Inventory:
    """The inventory from lists of ForeignClusters, VirtualNodes, Nodes and Pods (dicts from the API).

    Nodes that are not Liqo virtual nodes are ignored. A virtual node whose cluster has no ForeignCluster
    appears under a cluster marked down, so the admin sees it instead of it silently vanishing.
    """
    used = usage_by_node(pods)
    node_by_name = {n["metadata"]["name"]: n for n in nodes if _is_virtual(n)}
    vn_by_name = {v["metadata"]["name"]: v for v in virtual_nodes}
    errors: list[str] = []
    records: list[VirtualNodeRecord] = []
    for name in sorted(set(node_by_name) | set(vn_by_name)):
        try:
            records.append(virtual_node_record(node_by_name.get(name), vn_by_name.get(name),
                                               used.get(name) or NodeUsage()))
        except ValueError as exc:
            errors.append(str(exc))
    by_cluster: dict[str, list[VirtualNodeRecord]] = {}
    for record in records:
        by_cluster.setdefault(record.cluster_id, []).append(record)
    clusters: list[ClusterRecord] = []
    seen: set[str] = set()
    for fc in sorted(foreign_clusters, key=lambda o: o["metadata"]["name"]):
        cid = (fc.get("spec") or {}).get("clusterID") or fc["metadata"]["name"]
        seen.add(cid)
        health, reason = cluster_health(fc)
        role = (fc.get("status") or {}).get("role") or "Unknown"
        mine = tuple(by_cluster.get(cid, ()))
        clusters.append(ClusterRecord(cid, fc["metadata"]["name"], role, health, reason, mine))
    for cid in sorted(set(by_cluster) - seen):
        mine = tuple(by_cluster[cid])
        reason = f"no ForeignCluster with clusterID {cid!r} (peering removed or not visible to you)"
        clusters.append(ClusterRecord(cid, cid, "Unknown", "down", reason, mine))
    return Inventory(tuple(clusters), tuple(errors))


def inventory_to_dict(inventory: Inventory) -> dict[str, Any]:
    """JSON-ready form of the records (what the hub's user-scoped API sends; ``free`` included for readers)."""
    return asdict(inventory)


def inventory_from_dict(data: Mapping[str, Any]) -> Inventory:
    """The records back from ``inventory_to_dict`` output, so code after the transport is the same.

    Raises ``ValueError`` naming the entry that does not fit (a hub of another version, say).
    """
    node_fields = {f.name for f in fields(VirtualNodeRecord) if f.init}
    cluster_fields = {f.name for f in fields(ClusterRecord) if f.init} - {"virtual_nodes"}
    clusters = []
    for raw in data.get("clusters") or []:
        try:
            nodes = tuple(
                VirtualNodeRecord(**{k: v for k, v in n.items() if k in node_fields}) for n in raw.get("virtual_nodes") or []
            )
            clusters.append(ClusterRecord(**{k: v for k, v in raw.items() if k in cluster_fields}, virtual_nodes=nodes))
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"inventory entry {raw!r} does not fit ClusterRecord/VirtualNodeRecord: {exc}") from exc
    return Inventory(tuple(clusters), tuple(data.get("errors") or ()))
