"""One measured quantity and its summary: what a benchmark records, what a result file holds and what
``compare.py`` judges. Apart from the harness so that the comparison (which the harness prints after each run)
reads figures without importing the harness back."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, linearly interpolated between the nearest ranks; NaN for none
    (a load generator whose every request failed has no latency to report)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Figure:
    """One measured quantity: its samples, their summary and which way is better."""

    name: str
    unit: str
    samples: tuple[float, ...]
    lower_is_better: bool = True
    measured: int = 0
    """How many values were measured when ``samples`` keeps only their quantiles (0: every value is kept)."""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {"n": self.measured or len(s), "median": self.median, "p95": percentile(s, 0.95), "p99": percentile(s, 0.99),
                "min": min(s), "max": max(s)}

    def noise(self) -> float:
        """Relative run-to-run spread of the samples: half the interquartile range over the median."""
        if len(self.samples) < 4 or self.median == 0:
            return 0.0
        return (percentile(self.samples, 0.75) - percentile(self.samples, 0.25)) / 2 / abs(self.median)


KEPT_SAMPLES = 1001
"""Above this many samples a result keeps their 0.1% quantiles: a replay of thousands of queued runs would
otherwise write megabytes to bench/results, while the median, percentiles and spread read the same."""


def kept_samples(values: tuple[float, ...]) -> tuple[tuple[float, ...], int]:
    """``values`` as a result keeps them, and how many were measured (0: all kept)."""
    if len(values) <= KEPT_SAMPLES:
        return values, 0
    steps = KEPT_SAMPLES - 1
    return tuple(percentile(values, i / steps) for i in range(KEPT_SAMPLES)), len(values)
