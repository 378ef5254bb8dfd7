"""Pure decisions of Kueue's scheduler for one ClusterQueue: queue order, flavor assignment, fair-share usage.

Order (pkg/cache/queue/cluster_queue.go ``queueOrderingFunc``): with Admission Fair Sharing, the
LocalQueue with the lower usage first; then higher priority; then the earlier queue time (the creation
time, or the eviction's after a PodsReady timeout; whole seconds: ``GetQueueOrderTimestamp``); then the lower Workload UID, so two Workloads
queued within one second come out in an order nobody chose. Flavors (pkg/scheduler/flavorassigner): the first flavor in
the ClusterQueue's order whose unused nominal quota holds every covered resource the Workload asks for;
the messages are worded as Kueue words them. Simplifications: one resource group is considered (the
first covering all requested resources), every pod set of a Workload gets the same flavor, no borrowing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..apiserver.matching import quantity, term_matches

Amounts = Mapping[str, Decimal]


@dataclass(frozen=True)
class Flavor:
    """One flavor of a ClusterQueue's resource group with its nominal quota."""

    name: str
    nominal: Amounts


@dataclass(frozen=True)
class Entry:
    """A pending Workload as the queue sees it."""

    namespace: str
    name: str
    queue: str
    priority: int
    queued_at: str
    """RFC 3339: the queue-order time (creation, or the eviction's after a PodsReady timeout)."""
    requests: Amounts = field(default_factory=dict)
    uid: str = ""
    """The Workload's UID: Kueue's last tie-break (``baseCompareFunc``), so within one second (timestamps have
    whole seconds) the order is the UIDs', not the arrival's."""
    flavors: frozenset[str] | None = None
    """The flavors whose node labels its pods' node selector and required node affinity allow (None: all)."""


NO_AFFINITY = "doesn't match node affinity"


@dataclass(frozen=True)
class Assignment:
    """A flavor for the Workload, or why none fits now (``fits_ever`` False: it can never fit)."""

    flavor: str | None
    message: str = ""
    fits_ever: bool = True


def flavors_of(cluster_queue: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[Flavor, ...]]:
    """The covered resources and flavors of the ClusterQueue's first resource group."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    if not groups:
        return (), ()
    group = groups[0]
    flavors = tuple(Flavor(f["name"], {r["name"]: quantity(r["nominalQuota"]) for r in f["resources"]})
                    for f in group["flavors"])
    return tuple(group["coveredResources"]), flavors


def order(entries: Iterable[Entry], lq_usage: Mapping[str, float] | None = None) -> list[Entry]:
    """The ClusterQueue's pending Workloads, head first (``lq_usage`` given: Admission Fair Sharing)."""
    def key(e: Entry) -> tuple[float, int, str, str]:
        usage = lq_usage.get(f"{e.namespace}/{e.queue}", 0.0) if lq_usage is not None else 0.0
        return (usage, -e.priority, e.queued_at, e.uid)
    return sorted(entries, key=key)


def _fmt(value: Decimal) -> str:
    return format(value.normalize(), "f")


def allowed(entry: Entry, flavors: Sequence[Flavor]) -> tuple[Flavor, ...]:
    """The flavors ``entry``'s node affinity allows, in the ClusterQueue's order."""
    return tuple(flavors) if entry.flavors is None else tuple(f for f in flavors if f.name in entry.flavors)


def matching_flavors(templates: Iterable[Mapping[str, Any]], node_labels: Mapping[str, Mapping[str, str]]
                     ) -> frozenset[str] | None:
    """The flavors (name -> ``nodeLabels``) every pod template's ``nodeSelector`` and required node affinity
    allow, None when no template constrains a key any flavor labels. As Kueue's flavor assigner since 0.19
    (and 0.17.8, 0.18.6): each flavor is checked on the keys of its own ``nodeLabels`` only, so a requirement
    on a key a flavor lacks does not exclude it (the scheduler, not Kueue, then finds no node)."""
    keys = {k for labels in node_labels.values() for k in labels}
    allowed_names = set(node_labels)
    constrained = False
    for template in templates:
        spec = template.get("spec") or {}
        selector = dict(spec.get("nodeSelector") or {})
        affinity = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = [list(t.get("matchExpressions") or []) for t in affinity.get("nodeSelectorTerms") or []]
        if not keys & (set(selector) | {r.get("key") for t in terms for r in t}):
            continue
        constrained = True
        for name, labels in node_labels.items():
            if not _flavor_allows(labels, selector, terms):
                allowed_names.discard(name)
    return frozenset(allowed_names) if constrained else None


def _flavor_allows(labels: Mapping[str, str], selector: Mapping[str, str], terms: list[list[Any]]) -> bool:
    """One flavor against one template, on the flavor's own keys: the selector's entries on them, and any term
    whose requirements on them hold (a term with none on them lets the flavor through)."""
    if any(labels[k] != v for k, v in selector.items() if k in labels):
        return False
    own = [[r for r in t if r.get("key") in labels] for t in terms]
    return not own or any(not t or term_matches({"matchExpressions": t}, labels, "") for t in own)


def assign(requests: Amounts, covered: Sequence[str], flavors: Sequence[Flavor],
           used: Mapping[str, Amounts], entry: Entry | None = None) -> Assignment:
    """The first flavor whose unused quota holds ``requests`` (with ``entry``, among the flavors its node affinity
    allows), or Kueue's message: as its flavor assigner, one reason per flavor tried, sorted and joined."""
    wanted = {r: v for r, v in requests.items() if v > 0}
    for resource in sorted(wanted):
        if resource not in covered:
            return Assignment(None, f"couldn't assign flavors to pod set main: resource {resource} unavailable "
                                    "in ClusterQueue", fits_ever=False)
    reasons: list[str] = []
    if entry is not None and entry.flavors is not None:
        reasons = [f"flavor {f.name} {NO_AFFINITY}" for f in flavors if f.name not in entry.flavors]
        flavors = allowed(entry, flavors)
    ever = False
    for flavor in flavors:
        problem = _flavor_problem(wanted, flavor, used)
        if not problem:
            return Assignment(flavor.name)
        ever = ever or not problem.startswith("insufficient quota")
        reasons.append(problem)
    return Assignment(None, f"couldn't assign flavors to pod set main: {', '.join(sorted(reasons)) or 'no flavors'}",
                      fits_ever=ever)


def _flavor_problem(wanted: Amounts, flavor: Flavor, used: Mapping[str, Amounts]) -> str:
    """Why ``flavor`` cannot hold ``wanted`` now (its first resource short, in Kueue's words), or ""."""
    for resource in sorted(wanted):
        nominal = flavor.nominal.get(resource, Decimal(0))
        free = nominal - used.get(flavor.name, {}).get(resource, Decimal(0))
        if wanted[resource] > nominal:
            return (f"insufficient quota for {resource} in flavor {flavor.name}, previously considered podsets "
                    f"requests (0) + current podset request ({_fmt(wanted[resource])}) > maximum capacity "
                    f"({_fmt(nominal)})")
        if wanted[resource] > free:
            return (f"insufficient unused quota for {resource} in flavor {flavor.name}, "
                    f"{_fmt(wanted[resource] - free)} more needed")
    return ""


def add(into: dict[str, dict[str, Decimal]], flavor: str, amounts: Amounts, sign: int = 1) -> None:
    """Add (or with ``sign=-1`` remove) ``amounts`` to a flavor's usage."""
    bucket = into.setdefault(flavor, {})
    for resource, value in amounts.items():
        bucket[resource] = bucket.get(resource, Decimal(0)) + sign * value


def alpha(elapsed: float, half_life: float) -> float:
    """``calculateAlphaRate``: the weight new usage gets after ``elapsed`` seconds, 1 - 0.5^(elapsed/halfLife);
    0 with a half-life of 0 (Kueue then keeps no history at all)."""
    return 0.0 if half_life <= 0 else 1 - math.pow(0.5, max(elapsed, 0.0) / half_life)


def decayed(consumed: Mapping[str, float], current: Mapping[str, float], elapsed: float,
            half_life: float) -> dict[str, float]:
    """``CalculateDecayedConsumed``: old consumption decays, the current usage fills in the rest."""
    rate = alpha(elapsed, half_life)
    keys = set(consumed) | set(current)
    return {k: consumed.get(k, 0.0) * (1 - rate) + current.get(k, 0.0) * rate for k in sorted(keys)}


def entry_penalty(requests: Amounts, sampling: float, half_life: float) -> dict[str, float]:
    """``CalculateEntryPenalty``: what an admission adds to its LocalQueue's usage at once."""
    rate = alpha(sampling, half_life)
    return {r: float(v) * rate for r, v in requests.items()}


def usage_value(consumed: Mapping[str, float], weights: Mapping[str, float] | None = None,
                lq_weight: float = 1.0) -> float:
    """``CalculateUsage``: the sum of consumed resources (plus pending penalties), each times its
    ``resourceWeights`` entry (1 when absent: a memory request in bytes outweighs GPUs unless weighted down),
    over the LocalQueue's ``fairSharing.weight``."""
    if lq_weight <= 0:
        return math.inf
    return sum((weights or {}).get(r, 1.0) * v for r, v in consumed.items()) / lq_weight
