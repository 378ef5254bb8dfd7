"""Admission Fair Sharing's usage ledger, kept per LocalQueue as Kueue keeps it (pkg/cache/queue/afs, and the
LocalQueue and Workload reconcilers that write it, at the commit of ../shared/kueue-crds).

Kueue's ledger holds, per LocalQueue, a decayed consumption and the time it was last decayed. Three things
change it: the LocalQueue reconciler, every ``usageSamplingInterval`` after the queue's last update, decays it
towards the queue's admitted usage; the scheduler, on admitting a Workload, pushes an *entry penalty* (its
requests x ``1 - 0.5^(sampling / halfLife)``) so a burst of admissions counts before the next sample; the
Workload reconciler, when that Workload turns Admitted, decays the history towards the admitted usage (now
including the Workload) over the time since the last update and folds the penalty in for good. The sandbox
reserves quota and admits in one step, so the penalty is pushed and settled together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .scheduler import Amounts, decayed, entry_penalty, usage_value


@dataclass
class LedgerEntry:
    """One LocalQueue's consumption history."""

    consumed: dict[str, float] = field(default_factory=dict)
    last_update: float = 0.0
    """``time.monotonic()`` of the last decay."""


@dataclass
class UsageLedger:
    """The decayed consumption of every LocalQueue (``namespace/name``), in memory like Kueue's."""

    half_life: float
    sampling: float
    resource_weights: Mapping[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    entries: dict[str, LedgerEntry] = field(default_factory=dict)

    def usage(self, lq_weights: Mapping[str, float]) -> dict[str, float]:
        """``CalculateUsage`` of every LocalQueue with history: what Admission Fair Sharing orders by."""
        return {key: usage_value(entry.consumed, self.resource_weights, lq_weights.get(key, 1.0))
                for key, entry in self.entries.items()}

    def sample(self, admitted: Mapping[str, Mapping[str, float]], queues: Iterable[str]) -> set[str]:
        """The LocalQueue reconciler's pass: decay each queue due for a sample (a new one starts its history
        now) towards its admitted usage; returns the queues sampled, whose status shows the new value."""
        now, sampled = self.clock(), set()
        for key in queues:
            entry = self.entries.get(key)
            if entry is not None and now - entry.last_update < self.sampling:
                continue
            if entry is None:
                entry = self.entries[key] = LedgerEntry(last_update=now)
            if self.half_life <= 0:  # Kueue resets the history: usage plays no part
                entry.consumed = {}
            else:
                entry.consumed = decayed(entry.consumed, admitted.get(key, {}), now - entry.last_update,
                                         self.half_life)
            entry.last_update = now
            sampled.add(key)
        return sampled

    def admit(self, key: str, requests: Amounts, admitted: Mapping[str, float]) -> None:
        """An admission: decay the queue's history towards ``admitted`` (its usage including this Workload)
        since its last update, then add the entry penalty of ``requests`` to it."""
        now = self.clock()
        entry = self.entries.setdefault(key, LedgerEntry(last_update=now))
        consumed = decayed(entry.consumed, admitted, max(now - entry.last_update, 0.0), self.half_life)
        for resource, value in entry_penalty(requests, self.sampling, self.half_life).items():
            consumed[resource] = consumed.get(resource, 0.0) + value
        entry.consumed, entry.last_update = consumed, now

    def forget(self, live: Iterable[str]) -> None:
        """Drop the history of deleted LocalQueues (Kueue deletes their ledger entry)."""
        keep = set(live)
        self.entries = {k: v for k, v in self.entries.items() if k in keep}
