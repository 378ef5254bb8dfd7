"""Choosing a virtual node for a request, and the pod scheduling fragment that sends a pod there.

Policies are small objects ranking candidate nodes; ``place`` does the filtering (health, readiness,
cordon, model, cluster) and the error messages, so every policy gets the same guarantees for free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import labels as L
from .errors import InvalidRequest, NoFit, UnknownCluster, UnknownModel
from .inventory import ClusterRecord, Inventory, VirtualNodeRecord
from .shares import place_share
from .sharing import FractionRequest, ResourceAsk

AUTO = "auto"


@dataclass(frozen=True)
class PlacementRequest:
    """What a cell or step asks for."""

    gpus: int = 1
    gpu_model: str | None = None
    """Model as labelled on virtual nodes (case-insensitive), or None for any."""
    cluster: str = AUTO
    """A cluster id or ForeignCluster name, or ``auto``."""
    fallback_models: tuple[str, ...] = ()
    """Models to try in order when ``gpu_model`` has no fit (requires ``gpu_model``)."""
    cpu: int = 0
    """Millicores the pod requests (0: not checked). Placement skips nodes known to have less free."""
    memory: int = 0
    """Bytes of memory the pod requests (0: not checked)."""
    trusted_only: bool = False
    """Only clusters the origin trusts (the inventory's ``trusted``, which only origin-side configuration
    sets): whoever runs a donor's pod sees the code and inputs sent there."""
    cpu_only: bool = False
    """No GPU (``gpus`` 0): pods that ask for none, e.g. the CPU ranks of a distributed run. Said on purpose,
    so a caller that computed 0 GPUs by mistake still gets the error instead of a node chosen by CPU."""
    fraction: FractionRequest | None = None
    """Part of one GPU (``--gpus 0.5``, ``--gpu-memory 12Gi``): ``gpus`` is then 1 and the node is one whose
    donor shares GPUs in a way that can grant it (``shares.place_share``)."""

    def __post_init__(self) -> None:
        if self.fraction is not None and (self.gpus != 1 or self.cpu_only):
            raise InvalidRequest(f"gpus={self.gpus!r} with a fraction of a GPU: a fraction is part of one GPU")
        if self.cpu_only:
            if self.gpus != 0:
                raise InvalidRequest(f"gpus={self.gpus!r} with cpu_only: a CPU-only request asks for 0 GPUs")
        elif isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise InvalidRequest(f"gpus={self.gpus!r}: ask for a whole number of GPUs, 1 or more (e.g. --gpus 1)")
        if self.fallback_models and not self.gpu_model:
            raise InvalidRequest(
                f"fallback models {list(self.fallback_models)} given without a GPU model: "
                "name the preferred model first (e.g. --gpu-model A100)"
            )
        if not self.cluster:
            raise InvalidRequest("cluster is empty: give a cluster id or 'auto'")


@dataclass(frozen=True)
class NodeChoice:
    """Where a request goes: one virtual node of one cluster."""

    virtual_node: str
    cluster_id: str
    model: str | None
    gpus: int
    fallback: bool = False
    """True when the model is a fallback, not the one asked for (say so to the user)."""
    ask: ResourceAsk | None = None
    """For a fraction of a GPU: the resources the donor grants it in, the share held and the isolation."""

    def scheduling_fragment(self) -> dict[str, Any]:
        """Pod fields that send a pod here; see ``scheduling_fragment``."""
        return scheduling_fragment(self.cluster_id, self.gpus, self.ask)


class PlacementPolicy(Protocol):
    """Ranks usable candidates (already filtered for model, cluster, health and room)."""

    name: str

    def choose(self, candidates: Sequence[VirtualNodeRecord], gpus: int) -> VirtualNodeRecord:
        """The chosen node; ``candidates`` is never empty and every one has ``free >= gpus``."""
        ...


def price_key(vn: VirtualNodeRecord) -> float:
    # An unpriced node sorts after every priced one: the admin priced the others on purpose.
    return float("inf") if vn.price is None else vn.price


class MostFree:
    """Default: the node with the most free GPUs (spreads load), the cheapest on ties, then by name."""

    name = "most-free"

    def choose(self, candidates: Sequence[VirtualNodeRecord], gpus: int) -> VirtualNodeRecord:
        return min(candidates, key=lambda vn: (-vn.free, price_key(vn), vn.cluster_id, vn.name))


class BinPack:
    """The node left fullest after placing (keeps large holes for large requests), cheapest on ties."""

    name = "bin-pack"

    def choose(self, candidates: Sequence[VirtualNodeRecord], gpus: int) -> VirtualNodeRecord:
        return min(candidates, key=lambda vn: (vn.free - gpus, price_key(vn), vn.cluster_id, vn.name))


class FirstFit:
    """The first node in (cluster id, name) order: predictable, for tests and tiny setups."""

    name = "first-fit"

    def choose(self, candidates: Sequence[VirtualNodeRecord], gpus: int) -> VirtualNodeRecord:
        return min(candidates, key=lambda vn: (vn.cluster_id, vn.name))


POLICIES: dict[str, PlacementPolicy] = {p.name: p for p in (MostFree(), BinPack(), FirstFit())}


def most_cpu_free(candidates: Sequence[VirtualNodeRecord]) -> VirtualNodeRecord:
    """Where a CPU-only request goes: the node with the most CPU free, then memory free (a node that does not
    say comes after those that do), then by cluster id and name. The GPU policies rank GPUs, which such a
    request does not use, so it never goes through them."""
    def key(vn: VirtualNodeRecord) -> tuple[int, int, str, str]:
        return (-(vn.cpu_free if vn.cpu_free is not None else -1),
                -(vn.memory_free if vn.memory_free is not None else -1), vn.cluster_id, vn.name)
    return min(candidates, key=key)


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.lower() == b.lower()


def _usable(cluster: ClusterRecord) -> list[VirtualNodeRecord]:
    if cluster.health == "down":
        return []
    return [vn for vn in cluster.virtual_nodes if vn.ready and not vn.cordoned]


def _check_names(inventory: Inventory, request: PlacementRequest) -> list[ClusterRecord]:
    if request.cluster == AUTO:
        clusters = list(inventory.clusters)
    else:
        found = inventory.cluster(request.cluster)
        if found is None:
            valid = tuple(c.cluster_id for c in inventory.clusters)
            raise UnknownCluster(
                f"no peered cluster {request.cluster!r}; valid: {', '.join(valid) or 'none (peer one first)'}"
                " or 'auto'",
                valid,
            )
        clusters = [found]
    known = sorted({vn.model for vn in inventory.virtual_nodes if vn.model})
    for model in (request.gpu_model, *request.fallback_models):
        if model is not None and not any(_same(model, k) for k in known):
            raise UnknownModel(
                f"no virtual node has GPU model {model!r}; models: {', '.join(known) or 'none labelled'}"
                f" (label virtual nodes with {L.GPU_MODEL})",
                tuple(known),
            )
    return clusters


def place(
    inventory: Inventory,
    request: PlacementRequest,
    policy: PlacementPolicy | None = None,
    avoid: Collection[str] = (),
) -> NodeChoice:
    """Choose a virtual node for ``request``, trying the model then each fallback model in order.

    Skips clusters that are down, nodes not ready and cordoned nodes, and the cluster ids in ``avoid``
    (a retry after a virtual node was lost goes elsewhere). Raises ``UnknownCluster`` or
    ``UnknownModel`` listing the valid names, or ``NoFit`` saying what is free instead.
    """
    policy = policy or MostFree()
    clusters = [c for c in _check_names(inventory, request) if c.cluster_id not in avoid]
    skipped: list[str] = []
    if request.trusted_only:
        skipped = [c.cluster_id for c in clusters if not c.trusted]
        clusters = _trusted(clusters, request)
    if request.fraction is not None:
        return _place_fraction(clusters, request, skipped)
    # One pass groups the nodes with room by model, so each fallback costs a dict lookup, not a scan.
    roomy: dict[str | None, list[VirtualNodeRecord]] = {}
    short: list[VirtualNodeRecord] = []  # the GPUs are free, the CPU or memory asked for is not
    for cluster in clusters:
        for vn in _usable(cluster):
            if vn.free >= request.gpus:
                if has_room(vn, request):
                    roomy.setdefault(vn.model.lower() if vn.model else None, []).append(vn)
                else:
                    short.append(vn)
    models: list[str | None] = [request.gpu_model, *request.fallback_models]
    for index, model in enumerate(models):
        if model is None:
            fits = [vn for group in roomy.values() for vn in group]
        else:
            fits = roomy.get(model.lower(), [])
        if fits:
            chosen = most_cpu_free(fits) if request.cpu_only else policy.choose(fits, request.gpus)
            return NodeChoice(chosen.name, chosen.cluster_id, chosen.model, request.gpus, fallback=index > 0)
    wanted = [vn for vn in short if request.gpu_model is None
              or any(_same(vn.model, m) for m in (request.gpu_model, *request.fallback_models))]
    error = no_room(request, wanted) if wanted else no_fit(request, clusters)
    if skipped:
        error = NoFit(f"{error}; only trusted clusters were asked for, and {', '.join(skipped)} "
                      f"{'is' if len(skipped) == 1 else 'are'} not trusted", error.alternatives)
    raise error


def place_one(
    inventory: Inventory,
    request: PlacementRequest,
    policy: PlacementPolicy | None = None,
    avoid: Collection[str] = (),
) -> NodeChoice:
    """:func:`place` for one pod; one whole GPU that no donor lending whole GPUs has room for goes to a donor
    that lends GPUs through a memory isolator, asked for as one slot with all of the GPU's memory
    (``sharing.resource_ask``), so the pod holds that GPU alone. Raises ``place``'s error when none has room."""
    try:
        return place(inventory, request, policy, avoid)
    except NoFit as error:
        if request.fraction is not None or request.gpus != 1 or request.cpu_only:
            raise
        first = error
    clusters = [c for c in _check_names(inventory, request) if c.cluster_id not in avoid
                and (c.trusted or not request.trusted_only)]
    nodes = [vn for cluster in clusters for vn in _usable(cluster) if vn.sharing == "memory"]
    if not nodes:
        raise first
    try:
        pick = place_share(nodes, FractionRequest(1.0), [request.gpu_model, *request.fallback_models],
                           lambda vn: has_room(vn, request), price_key)
    except NoFit:
        raise first from None
    vn = pick.node
    return NodeChoice(vn.name, vn.cluster_id, vn.model, 1, fallback=pick.model_index > 0, ask=pick.ask)


def _place_fraction(clusters: Sequence[ClusterRecord], request: PlacementRequest, skipped: list[str]) -> NodeChoice:
    assert request.fraction is not None
    nodes = [vn for cluster in clusters for vn in _usable(cluster)]
    try:
        pick = place_share(nodes, request.fraction, [request.gpu_model, *request.fallback_models],
                           lambda vn: has_room(vn, request), price_key)
    except NoFit as error:
        if skipped:
            raise NoFit(f"{error}; only trusted clusters were asked for, and {', '.join(skipped)} "
                        f"{'is' if len(skipped) == 1 else 'are'} not trusted", ()) from None
        raise
    vn = pick.node
    return NodeChoice(vn.name, vn.cluster_id, vn.model, 1, fallback=pick.model_index > 0, ask=pick.ask)


def place_pods(
    inventory: Inventory,
    request: PlacementRequest,
    pods: int,
    policy: PlacementPolicy | None = None,
    avoid: Collection[str] = (),
) -> tuple[NodeChoice, ...]:
    """Virtual nodes that together take ``pods`` pods of ``request.gpus`` GPUs each (``--nodes`` with
    ``--spread``), on as few clusters as the policy finds: one node when one holds all the pods (as without
    ``--spread``, pod-to-pod traffic stays inside one cluster); else the policy's node for one pod, with as many
    pods as its free GPUs hold, then the same among the other clusters, until every pod has a place. Each
    choice's ``gpus`` is the GPUs of the pods it takes. Identical pods fit this way in any order the scheduler
    binds them, so a pod template allowed on these clusters finds room for all of them.

    Raises ``NoFit`` (the one-node error, with how many pods the clusters that fit a pod would take) when the
    clusters together have no room for every pod.
    """
    if pods < 1:
        raise InvalidRequest(f"pods={pods!r}: ask for 1 or more pods (--nodes)")
    try:
        return (place(inventory, dataclasses.replace(request, gpus=request.gpus * pods), policy, avoid),)
    except NoFit as whole:
        if pods == 1:
            raise
        first = whole
    free = {(vn.cluster_id, vn.name): vn.free for vn in inventory.virtual_nodes}
    chosen: list[NodeChoice] = []
    left, skip = pods, set(avoid)
    while left:
        try:
            one = place(inventory, request, policy, skip)
        except NoFit:
            placed = pods - left
            raise NoFit(f"{first}; spread over the clusters that have room for a pod of {_what(request.gpus, None)} "
                        f"there is room for {placed} of the {pods} pods"
                        + (f" ({', '.join(c.cluster_id for c in chosen)})" if chosen else ""),
                        first.alternatives) from None
        take = min(left, free.get((one.cluster_id, one.virtual_node), request.gpus) // request.gpus)
        chosen.append(dataclasses.replace(one, gpus=take * request.gpus))
        left -= take
        skip.add(one.cluster_id)
    return tuple(chosen)


TRUST_FIX = ("ask your admin to trust one (the chart's clusters.<id>.trusted; outside a hub "
             "GPU_OFFLOAD_TRUSTED_CLUSTERS), or allow untrusted clusters for this work")


def _trusted(clusters: list[ClusterRecord], request: PlacementRequest) -> list[ClusterRecord]:
    """The trusted ones among ``clusters``; ``NoFit`` naming the untrusted ones when none is left."""
    trusted = [c for c in clusters if c.trusted]
    if trusted:
        return trusted
    names = ", ".join(c.cluster_id for c in clusters)
    where = "no peered cluster is trusted" if request.cluster == AUTO else f"cluster {request.cluster} is not trusted"
    listed = f" ({names} {'is' if len(clusters) == 1 else 'are'} untrusted)" if clusters and request.cluster == AUTO else ""
    raise NoFit(f"only trusted clusters were asked for and {where}{listed}: {TRUST_FIX}", ())


def has_room(vn: VirtualNodeRecord, request: PlacementRequest) -> bool:
    """Whether the node has the CPU and memory the request asks for, as far as the node says."""
    return ((not request.cpu or vn.cpu_free is None or vn.cpu_free >= request.cpu)
            and (not request.memory or vn.memory_free is None or vn.memory_free >= request.memory))


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def no_room(request: PlacementRequest, short: Sequence[VirtualNodeRecord]) -> NoFit:
    """The error when nodes have the GPUs but not the CPU or memory asked for: how much they do have."""
    model = f" {request.gpu_model}" if request.gpu_model else ""
    asked: list[str] = []
    have: list[str] = []
    if request.memory:
        best = max(short, key=lambda vn: vn.memory_free if vn.memory_free is not None else 2**63)
        asked.append(f"{_size(request.memory)} of memory")
        if best.memory_free is not None and best.memory_free < request.memory:
            have.append(f"at most {_size(best.memory_free)} of memory free ({best.cluster_id})")
    if request.cpu:
        best = max(short, key=lambda vn: vn.cpu_free if vn.cpu_free is not None else 2**63)
        asked.append(f"{request.cpu / 1000:g} CPUs")
        if best.cpu_free is not None and best.cpu_free < request.cpu:
            have.append(f"at most {best.cpu_free / 1000:g} CPUs free ({best.cluster_id})")
    where = "no cluster has" if request.cluster == AUTO else f"cluster {request.cluster} does not have"
    return NoFit(
        f"{where} {_what(request.gpus, request.gpu_model)} with {' and '.join(asked)}: {len(short)} node(s) have "
        f"the{model} GPUs, with {'; '.join(have) or 'less free than that'}. Ask for less memory or CPU "
        "(for cells: GPU_OFFLOAD_MEMORY)",
        _alternatives_of(short))


def _alternatives_of(nodes: Sequence[VirtualNodeRecord]) -> tuple[tuple[str, str | None, int], ...]:
    return tuple(sorted({(vn.cluster_id, vn.model, vn.free) for vn in nodes}, key=lambda a: (a[0], a[1] or "")))


def _what(n: int, model: str | None) -> str:
    if not n:  # a CPU-only request
        return f"a ready {model} node" if model else "a ready virtual node"
    return f"{n} free {model}" if model else f"{n} free GPU" + ("" if n == 1 else "s")


MAX_LISTED = 5
"""Alternatives named in a no-fit message; the exception's ``alternatives`` holds all of them."""


def _alternatives(clusters: Sequence[ClusterRecord]) -> tuple[tuple[str, str | None, int], ...]:
    best: dict[tuple[str, str | None], int] = {}
    for cluster in clusters:
        for vn in _usable(cluster):
            if vn.free:
                key = (cluster.name, vn.model)
                best[key] = max(best.get(key, 0), vn.free)
    ordered = sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
    return tuple((name, model, free) for (name, model), free in ordered)


def no_fit(request: PlacementRequest, clusters: Sequence[ClusterRecord]) -> NoFit:
    """The error for a request nothing can take, naming the largest free blocks (per cluster and model)."""
    alternatives = _alternatives(clusters)
    wanted: list[str | None] = [request.gpu_model, *request.fallback_models] if request.gpu_model else [None]
    where = "no cluster has" if request.cluster == AUTO else f"cluster {request.cluster} does not have"
    message = f"{where} {' or '.join(_what(request.gpus, m) for m in wanted)}"
    if request.cpu_only:
        # GPUs free elsewhere are no alternative: what is missing is a usable node (or one of the model)
        down = [f"{c.name} ({c.health}: {c.reason})" for c in clusters if c.health == "down"]
        message += ((f"; down: {', '.join(down)}" if down else "")
                    + " (`gpu-offload clusters` shows which nodes are ready, cordoned or down)")
        return NoFit(message, alternatives)
    if alternatives:
        # The requested models first, then the largest blocks: what the user is most likely to take.
        def rank(alt: tuple[str, str | None, int]) -> tuple[bool, int]:
            return (not any(w is None or _same(alt[1], w) for w in wanted), -alt[2])

        shown = sorted(alternatives, key=rank)[:MAX_LISTED]
        message += "; " + ", ".join(
            f"{name} has {_what(free, model)}" if i == 0 else f"{name} {_what(free, model)}"
            for i, (name, model, free) in enumerate(shown)
        )
        if len(alternatives) > len(shown):
            message += f" and {len(alternatives) - len(shown)} more (gpu-offload clusters lists them)"
        message += _hints(request, alternatives, wanted)
    else:
        down = [f"{c.name} ({c.health}: {c.reason})" for c in clusters if c.health == "down"]
        message += "; no GPU is free anywhere right now" + (f"; down: {', '.join(down)}" if down else "")
        message += " (retry later, or ask your admin for more GPUs)"
    return NoFit(message, alternatives)


def _hints(
    request: PlacementRequest, alternatives: tuple[tuple[str, str | None, int], ...], wanted: list[str | None]
) -> str:
    hints: list[str] = []
    other_models = sorted(
        {m for _, m, free in alternatives if m and free >= request.gpus and not any(_same(m, w) for w in wanted)}
    )
    hints += [f"--gpu-model {m}" for m in other_models[:MAX_LISTED]]
    same_model = [free for _, m, free in alternatives if any(w is None or _same(m, w) for w in wanted)]
    if same_model:
        hints.append(f"--gpus {max(same_model)}")
    return f" (use {' or '.join(hints)})" if hints else ""


def scheduling_fragment(cluster_id: str | Sequence[str], gpus: int, ask: ResourceAsk | None = None) -> dict[str, Any]:
    """The pod fields that land a pod on a virtual node of ``cluster_id`` (or of any of several cluster ids:
    a Job whose pods may span donors) with ``gpus`` GPUs.

    ``resources`` belongs to the container; ``tolerations`` and ``affinity`` to the pod spec. The
    toleration is the one Liqo's webhook would add in an offloaded namespace: adding it ourselves means the
    user never writes it. The remote side drops the affinity; the GPU request finds a GPU node there. With
    ``gpus`` 0 (CPU ranks) the pod asks for no GPU and still goes to that cluster's virtual node. With ``ask``
    (a fraction of a GPU) the pod asks for its resources instead: shares, a MIG profile or an isolator's memory.
    """
    clusters = [cluster_id] if isinstance(cluster_id, str) else list(cluster_id)
    if not clusters:
        raise InvalidRequest("no cluster id for the pod's node affinity: place the request first")
    return {
        "resources": ({"limits": {r: str(n) for r, n in ask.resources}} if ask is not None
                      else {"limits": {L.GPU_RESOURCE: str(gpus)}} if gpus else {}),
        "tolerations": [{"key": L.VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": L.VIRTUAL_NODE_TAINT_EFFECT}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": L.REMOTE_CLUSTER_ID_LABEL, "operator": "In", "values": clusters},
                                {"key": L.TYPE_LABEL, "operator": "In", "values": [L.TYPE_VIRTUAL_NODE]},
                            ]
                        }
                    ]
                }
            }
        },
    }
