"""Placing a fraction of a GPU: which virtual node can grant it, in the units its donor lends GPUs in.

Pure. ``placement.place`` hands over the usable nodes (health, readiness, cordon, cluster and trust already
filtered); each node's donor says how it shares (``VirtualNodeRecord.offer``), ``sharing.resource_ask`` turns the
fraction into what that donor can grant, and a node fits when every resource of the ask is free there.

Among the nodes that fit, the one where the ask holds the least of a GPU (a 1g.10gb MIG profile wastes less of
a GPU than half of a time-sliced one for an 8 GiB need), then the one left with the fewest free units of what
was asked (packing fractions together keeps other GPUs whole for whole-GPU work), then the cheaper, then by
cluster id and name. A virtual node hides
its donor's GPUs, so the per-GPU packing of ``packing`` (FGD) is the donor's scheduler's to do, not the origin's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from .errors import CannotShare, NoFit
from .inventory import VirtualNodeRecord, lends_whole
from .sharing import GIB, FractionRequest, ResourceAsk, resource_ask

MEMORY_ISOLATED = ("memory", "compute and memory")
SHARES = ("time-slicing", "mps")
"""Modes that lend a GPU as replicas of one resource."""


@dataclass(frozen=True)
class SharePick:
    """The node chosen for a fraction, what to ask it for, and which of the wanted models it has."""

    node: VirtualNodeRecord
    ask: ResourceAsk
    model_index: int
    """0: the model asked for (or any); more: a fallback model."""


def describe(fraction: FractionRequest) -> str:
    """The fraction as a user wrote it, for messages: ``0.5 of a GPU``, ``12.0 GiB of GPU memory``."""
    parts = []
    if fraction.gpus < 1:
        parts.append(f"{fraction.gpus:g} of a GPU")
    if fraction.memory is not None:
        parts.append(f"{fraction.memory / GIB:.1f} GiB of GPU memory")
    return " and ".join(parts) or f"{fraction.gpus:g} GPU"


def _same(a: str | None, b: str | None) -> bool:
    return b is None or (a is not None and a.lower() == b.lower())


def _asks(nodes: Sequence[VirtualNodeRecord], fraction: FractionRequest, models: Sequence[str | None],
          clusters: Sequence[str], refused: dict[str, str]) -> Iterator[tuple[VirtualNodeRecord, ResourceAsk]]:
    """Each node of one of ``models`` (None: any) on one of ``clusters`` (all when empty) with what its donor
    would be asked for ``fraction``; a donor that cannot lend it in its units is left out, its first reason
    recorded per cluster in ``refused``."""
    for vn in nodes:
        if (clusters and vn.cluster_id not in clusters) or not any(_same(vn.model, m) for m in models):
            continue
        try:
            ask = resource_ask(fraction, vn.offer())
        except (CannotShare, ValueError) as exc:
            refused.setdefault(vn.cluster_id, str(exc))
            continue
        yield vn, ask


def place_share(nodes: Sequence[VirtualNodeRecord], fraction: FractionRequest, models: Sequence[str | None],
                room: Callable[[VirtualNodeRecord], bool], price: Callable[[VirtualNodeRecord], float]) -> SharePick:
    """The node for ``fraction`` among ``nodes``, trying each of ``models`` in order (None: any).

    ``room`` says whether a node has the CPU and memory the pod asks for, ``price`` ranks equal nodes. Raises
    ``NoFit`` naming, per cluster, why it cannot share (its donor lends whole GPUs only, no MIG profile is large
    enough, ...) or that every share it lends is taken right now.
    """
    refused: dict[str, str] = {}
    full: dict[str, str] = {}
    for index, model in enumerate(models):
        fits: list[tuple[float, int, float, str, str, VirtualNodeRecord, ResourceAsk]] = []
        for vn, ask in _asks(nodes, fraction, (model,), (), refused):
            short = [f"{n} {r}" for r, n in ask.resources if vn.device_free(r) < n]
            if short or not room(vn):
                full.setdefault(vn.cluster_id, f"{vn.sharing} donor, {', '.join(short) or 'its CPU or memory'} "
                                               "not free right now")
                continue
            left = sum(vn.device_free(r) - n for r, n in ask.resources)
            fits.append((ask.share, left, price(vn), vn.cluster_id, vn.name, vn, ask))
        if fits:
            best = min(fits, key=lambda f: f[:5])
            return SharePick(best[5], best[6], index)
    raise _no_fit(fraction, refused, full)


def _no_fit(fraction: FractionRequest, refused: dict[str, str], full: dict[str, str]) -> NoFit:
    what = describe(fraction)
    if not refused and not full:
        return NoFit(f"no cluster can take {what}: no usable virtual node of the model asked for "
                     "(`gpu-offload clusters` shows which nodes are ready, cordoned or down)", ())
    lines = [f"{cluster}: {why}" for cluster, why in sorted(full.items())]
    lines += [f"{cluster}: {why}" for cluster, why in sorted(refused.items()) if cluster not in full]
    if full:
        head = f"no cluster has room for {what} right now (retry later, or queue with Kueue)"
    else:
        head = f"no cluster can lend {what}"
    return NoFit(f"{head}; " + "; ".join(lines), ())


def _same_part(ask: ResourceAsk) -> tuple[object, ...]:
    """What must be equal on every donor a queued part may land on: the resources asked for, and for shares the
    part of the GPU they are (shares over the donor's replicas), which the runner is told; the bytes that part
    is depend on the GPU it lands on, which the runner reads there (``queued_part``)."""
    return (ask.resources, ask.share if ask.mode in SHARES else None)


def queued_part(ask: ResourceAsk) -> ResourceAsk:
    """The ask as the runner of a queued part is told it: shares as the part of the GPU they are, not as the
    bytes of the cheapest donor's GPU (Kueue may admit it on a donor whose GPU is larger or smaller); the
    runner's cap and watch take that part of the GPU it runs on. A MIG profile's or an isolator's bytes are
    the same on every donor lending them with the same resources."""
    return replace(ask, memory_limit=None) if ask.mode in SHARES else ask


def queued_ask(nodes: Sequence[VirtualNodeRecord], fraction: FractionRequest, clusters: Sequence[str],
               models: Sequence[str | None], price: Callable[[VirtualNodeRecord], float]) -> tuple[ResourceAsk, tuple[str, ...]]:
    """With queueing on, Kueue picks the donor, so the pod must ask in units every donor it may land on lends:
    the ask of the cheapest donor that can grant ``fraction`` at all (free now or not), and the clusters among
    ``clusters`` (all when empty) whose nodes grant it with the same resources and, for shares, the same part
    of a GPU (``_same_part``). Raises ``NoFit`` naming why each donor cannot."""
    refused: dict[str, str] = {}
    by_part: dict[tuple[object, ...], list[tuple[float, str, ResourceAsk]]] = {}
    for vn, ask in _asks(nodes, fraction, models, clusters, refused):
        by_part.setdefault(_same_part(ask), []).append((price(vn), vn.cluster_id, ask))
    if not by_part:
        raise _no_fit(fraction, refused, {})
    best = min(by_part.values(), key=lambda group: min(p for p, _, _ in group))
    cheapest = min(best, key=lambda entry: entry[:2])[2]
    return queued_part(cheapest), tuple(sorted({cluster for _, cluster, _ in best}))


@dataclass(frozen=True)
class QueuedWhole:
    """Where a queued request of whole GPUs may go when some donors' ``nvidia.com/gpu`` counts shares or an
    isolator's slots: ``clusters`` to narrow the pod to (empty: no narrowing), and for one GPU on a memory
    isolator the ``ask`` (one slot and all of the GPU's memory) instead of plain ``nvidia.com/gpu``."""

    clusters: tuple[str, ...] = ()
    ask: ResourceAsk | None = None


def queued_whole(nodes: Sequence[VirtualNodeRecord], gpus: int, clusters: Sequence[str],
                 models: Sequence[str | None], price: Callable[[VirtualNodeRecord], float],
                 single: bool) -> QueuedWhole:
    """With queueing on, a flavor counts ``nvidia.com/gpu`` as its nodes offer it, so Kueue would admit a whole
    GPU to a time-sliced donor's flavor as one share, or to a memory isolator's as one slot without its memory.
    Among ``clusters`` (all when empty) of ``models``: when every donor lends whole GPUs, nothing changes; when
    some do, the pod is narrowed to them; when none does, one GPU of one pod (``single``) asks an isolator for a
    slot and all of its GPU's memory (as ``placement.place_one`` does), narrowed to the isolators that lend it so.
    Raises ``NoFit`` naming each donor's way of sharing when none of them can take it."""
    whole: set[str] = set()
    other: dict[str, str] = {}
    isolators: list[VirtualNodeRecord] = []
    for vn in nodes:
        if (clusters and vn.cluster_id not in clusters) or not any(_same(vn.model, m) for m in models):
            continue
        try:
            offer = vn.offer()
        except ValueError as exc:
            other.setdefault(vn.cluster_id, str(exc))
            continue
        if lends_whole(offer):
            whole.add(vn.cluster_id)
            continue
        other.setdefault(vn.cluster_id, f"its nvidia.com/gpu counts {offer.mode} "
                                        f"{'slots' if offer.mode == 'memory' else 'shares'}, not whole GPUs")
        if offer.mode == "memory":
            isolators.append(vn)
    if not other:
        return QueuedWhole()
    if whole:
        return QueuedWhole(tuple(sorted(whole)))
    if single and gpus == 1 and isolators:
        ask, on = queued_ask(isolators, FractionRequest(1.0), clusters, models, price)
        return QueuedWhole(on, ask)
    what = f"{gpus} whole GPU{'s' * (gpus != 1)}"
    fix = ("ask for --gpus 1 (a memory isolator lends one whole GPU per pod) or for part of a GPU (--gpus 0.5)"
           if isolators else
           "ask for part of a GPU (--gpus 0.5), or ask your admin for a donor that lends whole GPUs")
    raise NoFit(f"no donor lends {what} to a queued run: "
                + "; ".join(f"{c}: {why}" for c, why in sorted(other.items())) + f"; {fix}", ())


@dataclass(frozen=True)
class ClusterShare:
    """What a fraction is on one cluster: the phrase for the placement notice and, when the donor does not
    isolate GPU memory, the warning the cell shows once (empty otherwise)."""

    cluster: str
    text: str
    notice: str = ""


def _weakest(asks: Sequence[ResourceAsk]) -> ResourceAsk:
    """The ask of a cluster whose nodes may differ: one without memory isolation first, since the scheduler
    (or Kueue) may pick any of them."""
    return min(asks, key=lambda a: (a.isolation in MEMORY_ISOLATED, a.isolation == "compute and memory"))


def isolation_notice(fraction: FractionRequest, cluster: str, ask: ResourceAsk, isolating: Sequence[str]) -> str:
    """The warning for ``fraction`` held as ``ask`` on ``cluster`` when that donor does not isolate GPU memory
    (empty when it does), with what to do: a donor among ``isolating`` that does, or a whole GPU."""
    if ask.isolation in MEMORY_ISOLATED:
        return ""
    others = [c for c in isolating if c != cluster]
    if others:
        fix = (f"run it on a donor that isolates GPU memory (--cluster {' or --cluster '.join(others[:3])}) "
               "or ask for a whole GPU (--gpus 1)")
    else:
        fix = "no donor you can use lends part of a GPU with memory isolation, so ask for a whole GPU (--gpus 1)"
    return (f"{describe(fraction)} is not memory-isolated on cluster {cluster} ({ask.mode}): another pod on the "
            f"same GPU can take the memory this cell needs and make it run out of memory. To be isolated, {fix}.")


def _weakest_by_cluster(nodes: Sequence[VirtualNodeRecord], fraction: FractionRequest,
                        models: Sequence[str | None]) -> dict[str, ResourceAsk]:
    by_cluster: dict[str, list[ResourceAsk]] = {}
    for vn, ask in _asks(nodes, fraction, models, (), {}):
        by_cluster.setdefault(vn.cluster_id, []).append(ask)
    return {cluster: _weakest(asks) for cluster, asks in by_cluster.items()}


def isolating_clusters(nodes: Sequence[VirtualNodeRecord], fraction: FractionRequest, models: Sequence[str | None],
                       among: Sequence[str]) -> tuple[str, ...]:
    """The clusters among ``among`` (all when empty: the user's own narrowing, e.g. ``--trusted-only``) whose
    every node of one of ``models`` lends ``fraction`` with GPU memory isolated."""
    return tuple(sorted(c for c, ask in _weakest_by_cluster(nodes, fraction, models).items()
                        if ask.isolation in MEMORY_ISOLATED and (not among or c in among)))


def cluster_shares(nodes: Sequence[VirtualNodeRecord], fraction: FractionRequest | None, clusters: Sequence[str],
                   models: Sequence[str | None], among: Sequence[str],
                   placed: ResourceAsk | None = None) -> tuple[ClusterShare, ...]:
    """Per cluster of ``clusters`` (the one placed on as ``placed``, or the ones Kueue picks among), what
    ``fraction`` is there and its isolation warning, whose fix names the ``isolating_clusters`` among ``among``.
    A cluster whose nodes lend differently is described by one without isolation: Kueue may pick it."""
    if fraction is None:
        return ()
    weakest = _weakest_by_cluster(nodes, fraction, models)
    if placed is not None:
        weakest.update({c: placed for c in clusters})
    isolating = isolating_clusters(nodes, fraction, models, among)
    return tuple(ClusterShare(c, weakest[c].describe(), isolation_notice(fraction, c, weakest[c], isolating))
                 for c in clusters if c in weakest)
