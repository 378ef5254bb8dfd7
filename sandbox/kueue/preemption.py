"""Pure choice of victims for ``preemption.withinClusterQueue: LowerPriority`` (pkg/scheduler/preemption).

Kueue's classical preemption: candidates are the admitted Workloads of the same ClusterQueue with a lower
priority, taken lowest priority first and, among equals, the most recently admitted first; they are
removed one by one until the preemptor fits, then any whose removal turned out unnecessary is kept
(the "fill back" pass). Flavors are tried in the ClusterQueue's order. Not emulated: preemption in a
cohort, ``LowerOrNewerEqualPriority``, fair-sharing preemption strategies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from .scheduler import Amounts, Flavor, add


@dataclass(frozen=True)
class Admitted:
    """An admitted Workload as preemption sees it."""

    namespace: str
    name: str
    priority: int
    flavor: str
    usage: Amounts
    admitted_at: str


def _fits(requests: Amounts, flavor: Flavor, used: Amounts) -> bool:
    return all(v <= flavor.nominal.get(r, Decimal(0)) - used.get(r, Decimal(0)) for r, v in requests.items() if v > 0)


def victims(requests: Amounts, priority: int, flavors: Sequence[Flavor], admitted: Sequence[Admitted],
            used: Mapping[str, Amounts]) -> tuple[str, list[Admitted]] | None:
    """The flavor and the fewest lower-priority Workloads to evict so ``requests`` fit, or None."""
    for flavor in flavors:
        if not _fits(requests, flavor, {}):
            continue
        candidates = sorted((a for a in admitted if a.flavor == flavor.name and a.priority < priority),
                            key=lambda a: a.admitted_at, reverse=True)
        candidates.sort(key=lambda a: a.priority)
        usage: dict[str, dict[str, Decimal]] = {flavor.name: dict(used.get(flavor.name, {}))}
        chosen: list[Admitted] = []
        for candidate in candidates:
            if _fits(requests, flavor, usage[flavor.name]):
                break
            add(usage, flavor.name, candidate.usage, -1)
            chosen.append(candidate)
        if not _fits(requests, flavor, usage[flavor.name]):
            continue
        for candidate in reversed(list(chosen)):  # fill back what need not go
            add(usage, flavor.name, candidate.usage)
            if _fits(requests, flavor, usage[flavor.name]):
                chosen.remove(candidate)
            else:
                add(usage, flavor.name, candidate.usage, -1)
        return flavor.name, chosen
    return None
