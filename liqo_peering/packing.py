"""Packing fractions of GPUs onto donors' GPUs: best-fit, most-free, FGD and the project's policy.

A donor that shares its GPUs (``sharing``) can take several fractional cells on one GPU, so where a fraction
lands decides what is left for the next request. The four policies choose a node and the GPUs on it:

- ``best-fit``: the node, then the GPU, with the least free capacity that still fits (pack tight);
- ``most-free``: the node, then the GPU, with the most free capacity (spread);
- ``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC '23): the choice
  that least increases the node's *expected fragmentation*, the GPU capacity that the expected mix of requests
  could not use there (``fragmentation``). The mix is given up front (the paper's target workload);
- ``project``: FGD on the mix the pool has actually seen lately (no oracle: a deployment only knows the
  requests that came), preferring, among equally good choices, trusted donors and cheaper GPU-hours.

Capacities are in milli-GPUs (1000 = one GPU), as the trace and Kueue count them. Everything here is pure.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

WHOLE = 1000


@dataclass(frozen=True)
class GpuNode:
    """One virtual node's GPUs as packing sees them: the free milli-GPUs of each GPU, and its CPU and memory."""

    name: str
    cluster: str
    model: str
    free: tuple[int, ...]
    cpu_free: int = 0
    memory_free: int = 0
    price: float | None = None
    trusted: bool = False


@dataclass(frozen=True)
class Demand:
    """A request: ``gpus`` whole GPUs, or a ``milli`` share of one GPU (``gpus`` == 1, ``milli`` < 1000)."""

    milli: int
    gpus: int = 1
    cpu: int = 0
    memory: int = 0
    models: frozenset[str] = frozenset()

    @property
    def fractional(self) -> bool:
        return self.milli < WHOLE

    @property
    def total(self) -> int:
        return self.milli if self.fractional else WHOLE * self.gpus


@dataclass(frozen=True)
class Choice:
    node: str
    gpus: tuple[int, ...]
    """Indices of the node's GPUs the request takes."""


Mix = tuple[tuple[Demand, float], ...]
"""A request mix: each kind of request and its share of all requests (the shares sum to 1)."""


def mix_of(demands: Iterable[Demand]) -> Mix:
    """The mix of a list of requests, each kind weighted by how often it occurs."""
    counts = Counter(demands)
    total = sum(counts.values())
    return tuple((d, n / total) for d, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].milli)))


def kind(demand: Demand, granularity: int = 50) -> Demand:
    """The kind of request ``demand`` is, for a mix: its share rounded to ``granularity`` milli-GPUs, its CPU to
    whole cores, its memory dropped.

    Requests that differ by a few milli-GPUs or millicores fragment a node alike; rounding keeps a mix to a
    few dozen kinds, so a gradient costs that many checks rather than one per distinct request.
    """
    if not demand.fractional:
        return Demand(WHOLE, demand.gpus, round(demand.cpu / 1000) * 1000, 0, demand.models)
    milli = min(WHOLE - 1, max(granularity, round(demand.milli / granularity) * granularity))
    return Demand(milli, 1, round(demand.cpu / 1000) * 1000, 0, demand.models)


def _model_ok(node_model: str, demand: Demand) -> bool:
    return not demand.models or node_model in demand.models


def choices(node: GpuNode, demand: Demand) -> list[Choice]:
    """The distinct ways ``demand`` fits on ``node``: one per distinct free value for a fraction, one for whole GPUs."""
    if not _model_ok(node.model, demand) or demand.cpu > node.cpu_free or demand.memory > node.memory_free:
        return []
    if demand.fractional:
        seen: dict[int, int] = {}
        for i, f in enumerate(node.free):
            if f >= demand.milli and f not in seen:
                seen[f] = i
        return [Choice(node.name, (i,)) for i in seen.values()]
    idle = [i for i, f in enumerate(node.free) if f == WHOLE]
    return [Choice(node.name, tuple(idle[: demand.gpus]))] if len(idle) >= demand.gpus else []


def take(node: GpuNode, choice: Choice, demand: Demand) -> GpuNode:
    """The node after ``demand`` took the GPUs of ``choice``."""
    each = demand.milli if demand.fractional else WHOLE
    free = list(node.free)
    for i in choice.gpus:
        if free[i] < each:
            raise ValueError(f"GPU {i} of {node.name} has {free[i]} milli-GPUs free, fewer than {each}")
        free[i] -= each
    return replace(node, free=tuple(free), cpu_free=node.cpu_free - demand.cpu,
                   memory_free=node.memory_free - demand.memory)


def give_back(node: GpuNode, choice: Choice, demand: Demand) -> GpuNode:
    each = demand.milli if demand.fractional else WHOLE
    free = list(node.free)
    for i in choice.gpus:
        free[i] += each
    return replace(node, free=tuple(free), cpu_free=node.cpu_free + demand.cpu,
                   memory_free=node.memory_free + demand.memory)


def fragmentation(node: GpuNode, mix: Mix) -> float:
    """Expected milli-GPUs on ``node`` that the mix's requests could not use (the FGD paper's F_n(M)).

    For one kind of request: if it cannot run on the node at all (model, CPU, memory or GPUs), every free
    milli-GPU is a fragment; otherwise the GPUs whose free share is smaller than the request's share of one
    GPU are. The expectation weights each kind by its share of the mix.
    """
    return _fragmentation(node.model, tuple(sorted(node.free)), node.cpu_free, node.memory_free, mix)


@lru_cache(maxsize=200_000)
def _fragmentation(model: str, free: tuple[int, ...], cpu: int, memory: int, mix: Mix) -> float:
    total = sum(free)
    if total == 0:
        return 0.0
    expected = 0.0
    for demand, weight in mix:
        need = min(demand.milli, WHOLE)
        runs = _model_ok(model, demand) and demand.cpu <= cpu and demand.memory <= memory and (
            any(f >= need for f in free) if demand.fractional else sum(f == WHOLE for f in free) >= demand.gpus)
        expected += weight * (sum(f for f in free if f < need) if runs else total)
    return expected


class PackingPolicy(Protocol):
    name: str

    def choose(self, nodes: Sequence[GpuNode], demand: Demand) -> Choice | None:
        """The node and GPUs for ``demand``, or None when it fits nowhere."""
        ...


def _candidates(nodes: Sequence[GpuNode], demand: Demand) -> list[tuple[GpuNode, Choice]]:
    # Nodes in the same state are interchangeable to every policy here (ties go to the first name), and a
    # large pool is mostly idle nodes of a few shapes: evaluating one per state keeps a decision cheap.
    first: dict[tuple, GpuNode] = {}
    for n in nodes:
        key = (n.model, n.free, n.cpu_free, n.memory_free, n.trusted, n.price)
        if key not in first or n.name < first[key].name:
            first[key] = n
    return [(n, c) for n in first.values() for c in choices(n, demand)]


class _ByFree:
    """Chooses by free capacity: the least free that fits (``tight``) or the most free."""

    def __init__(self, name: str, tight: bool) -> None:
        self.name = name
        self.sign = 1 if tight else -1

    def choose(self, nodes: Sequence[GpuNode], demand: Demand) -> Choice | None:
        options = _candidates(nodes, demand)
        if not options:
            return None
        s = self.sign
        return min(options, key=lambda nc: (s * sum(nc[0].free), s * sum(nc[0].free[i] for i in nc[1].gpus),
                                            nc[0].name))[1]


def BestFit() -> PackingPolicy:  # noqa: N802 - reads as the policy it builds
    return _ByFree("best-fit", tight=True)


def MostFree() -> PackingPolicy:  # noqa: N802
    return _ByFree("most-free", tight=False)


def _gradient(node: GpuNode, choice: Choice, demand: Demand, mix: Mix) -> float:
    return fragmentation(take(node, choice, demand), mix) - fragmentation(node, mix)


class Fgd:
    """FGD with the request mix given up front, as the paper evaluates it."""

    name = "fgd"

    def __init__(self, mix: Mix) -> None:
        self.mix = mix

    def choose(self, nodes: Sequence[GpuNode], demand: Demand) -> Choice | None:
        options = _candidates(nodes, demand)
        if not options:
            return None
        return min(options, key=lambda nc: (_gradient(nc[0], nc[1], demand, self.mix), nc[0].name))[1]


class ProjectPolicy:
    """FGD on the mix of the last ``window`` requests (and those waiting), then trust, then price."""

    name = "project"

    def __init__(self, window: int = 2000, granularity: int = 50, refresh: int = 200) -> None:
        self.recent: deque[Demand] = deque(maxlen=window)
        self.granularity = granularity
        self.refresh = refresh
        """Requests between two recomputations of the mix: it drifts slowly, and every new mix costs each
        node's fragmentation afresh."""
        self._mix: Mix = ()
        self._since = 0

    def _kind(self, demand: Demand) -> Demand:
        return kind(demand, self.granularity)

    def observe(self, demand: Demand) -> None:
        """Record a request the pool saw (placed or not)."""
        self.recent.append(self._kind(demand))
        self._since += 1

    def mix(self, waiting: Iterable[Demand] = ()) -> Mix:
        extra = [self._kind(d) for d in waiting]
        if extra:
            return mix_of([*self.recent, *extra])
        if not self._mix or self._since >= self.refresh:
            self._mix = mix_of(self.recent) if self.recent else ()
            self._since = 0
        return self._mix

    def choose(self, nodes: Sequence[GpuNode], demand: Demand, waiting: Iterable[Demand] = ()) -> Choice | None:
        self.observe(demand)
        options = _candidates(nodes, demand)
        if not options:
            return None
        mix = self.mix(waiting)
        return min(options, key=lambda nc: (round(_gradient(nc[0], nc[1], demand, mix), 6), not nc[0].trusted,
                                            nc[0].price if nc[0].price is not None else float("inf"),
                                            nc[0].name))[1]
