"""Why a queued run waits and when it may start, from facts already read (a pure module: no I/O, no clock).

The inputs are what the kernel has seen: the run's place in its ClusterQueue (Kueue's visibility API), the
times at which runs ahead of it left the line (each step forward of a followed run's place is one), how long
the kernel has been watching, and the reason Kueue gives in the Workload's ``QuotaReserved`` condition
(:func:`waiting_messages` reads it from the namespace's Workloads, :func:`reason_of` classifies it).

The estimate is a rate: ``position + 1`` more admissions are needed before this run starts (those ahead, then
its own), and the line has recently moved at ``n / watched`` admissions a second. Its range widens with few
admissions seen, with few runs ahead, and with bursty admissions (the spread of the gaps between them), since
each of these makes the rate a worse guide. With too little history there is no estimate, said so, rather than
a number made up from two data points.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ....liqo_peering.untrusted_text import shown

QUOTA, PREEMPTING, NO_FIT, UNKNOWN = "quota", "preempting", "no-fit", "unknown"
"""The reasons a run waits, as Kueue states them (see :func:`reason_of`)."""
REASON_WORDS = {
    QUOTA: "every GPU the queue may use is taken; it starts as runs ahead of it are admitted",
    PREEMPTING: "Kueue is stopping a lower-priority run to make room for it",
    NO_FIT: "no donor offers what it asks for; it starts only when the pool changes",
    UNKNOWN: "waiting for Kueue to admit it",
}
MIN_ADMISSIONS = 3
"""Fewer admissions seen than this: no estimate."""
MIN_WATCHED = 60.0
"""Watched the line for less than this many seconds: no estimate (a burst seen at once is not a rate)."""
RECENT = 20
"""Only the last this many admissions count: the recent pace of the line, not yesterday's."""
Z80 = 1.2816
"""The normal quantile of 90 %: the range is meant to hold about 80 % of starts."""


QUEUED_KINDS = ("Pod", "Job")
"""Owners of the Workloads a kernel queues: a runner pod, or the Indexed Job of a distributed run."""
MESSAGE_LIMIT = 297
"""Kueue's message is shown up to this many characters, then an ellipsis: 300 at most (its longest, for a pod set
of many resources, is a few hundred)."""


def kueue_message(workload: Mapping[str, Any]) -> str:
    """Why Kueue holds a Workload back: its ``QuotaReserved=False`` condition's message as ``shown`` makes it fit
    (one printable line, cut at :data:`MESSAGE_LIMIT`: it reaches the notebook; nothing but Kueue writes a
    Workload's status, but the project shows no stored text unchecked); empty when it is not held back."""
    for condition in ((workload.get("status") or {}).get("conditions") or []):
        if isinstance(condition, Mapping) and condition.get("type") == "QuotaReserved":
            if condition.get("status") != "False":
                return ""
            return shown(condition.get("message") or "", MESSAGE_LIMIT)
    return ""


def waiting_messages(workloads: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Kueue's message for each pod (or distributed run's Job) whose Workload it holds back, by its name (the
    Workload's owner)."""
    found = {}
    for workload in workloads:
        owners = (workload.get("metadata") or {}).get("ownerReferences") or []
        pods = [str(ref.get("name")) for ref in owners if isinstance(ref, Mapping) and ref.get("kind") in QUEUED_KINDS]
        message = kueue_message(workload)
        if message and len(pods) == 1:
            found[pods[0]] = message
    return found


def reason_of(message: str) -> str:
    """The reason in Kueue's ``QuotaReserved=False`` message (or the Workload's ``Pending`` event)."""
    text = message.lower()
    if "pending the preemption" in text:
        return PREEMPTING
    if "insufficient unused quota" in text:
        return QUOTA  # the quota exists but is in use: waiting for it is worth it
    if "insufficient quota" in text or "couldn't assign flavors" in text or "no flavors" in text:
        return NO_FIT  # more than any flavor's quota, or no flavor matches the request
    return UNKNOWN


@dataclass(frozen=True)
class WaitEstimate:
    """Why a run waits and, when the history allows, when it should start (seconds from ``now``)."""

    reason: str
    words: str
    seconds: float | None
    """The expected wait still ahead; None: no estimate (see ``basis``)."""
    low: float | None
    high: float | None
    basis: str
    """What the estimate rests on, or why there is none."""

    def text(self) -> str:
        """``an estimate from the line's recent pace (7 admissions in the last 10 min): it starts in about 4 min,
        between 2 min 30 s and 6 min if that pace holds``: the range first said as the model's, since the line's
        pace often changes (a higher-priority run arriving, runs ahead ending at once), and then the start falls
        outside it (bench/bench_wait_bound.py measures how often)."""
        if self.seconds is None or self.low is None or self.high is None:
            return f"{self.words}; no estimate of the start yet: {self.basis}"
        span = (f"within {_span(self.high)}" if _span(self.low) == _span(0.0)
                else f"between {_span(self.low)} and {_span(self.high)}")
        return (f"{self.words}; an estimate from the line's recent pace ({self.basis}): it starts in about "
                f"{_span(self.seconds)}, {span} if that pace holds")


def _span(seconds: float) -> str:
    whole = int(round(max(seconds, 0)))
    if whole >= 3600:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    if whole >= 120:
        return f"{round(whole / 60)} min"
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def _burstiness(times: Sequence[float], start: float, now: float) -> float:
    """The coefficient of variation of the gaps between admissions (1 for a steady random pace, more when they
    come in bursts); at least 1, since fewer than a handful of gaps cannot show that a pace is steadier."""
    points = [start, *times, now]
    gaps = [b - a for a, b in zip(points, points[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    if len(gaps) < 3 or mean <= 0:
        return 1.0
    return max(1.0, statistics.pstdev(gaps) / mean)


def estimate(position: int | None, admissions: Sequence[float], watched_since: float, now: float,
             reason: str = QUOTA) -> WaitEstimate:
    """The wait of the run at ``position`` (from 0, Kueue's ``positionInClusterQueue``) given the ``admissions``
    (times, any order, on the same clock as ``now``) seen since ``watched_since``; ``reason`` from
    :func:`reason_of`."""
    words = REASON_WORDS.get(reason, REASON_WORDS[UNKNOWN])
    if reason not in (QUOTA, UNKNOWN):
        # a preemption's end or a change of the pool does not follow the pace of the line
        basis = ("it starts once the preempted run has stopped" if reason == PREEMPTING
                 else "the queue's pace says nothing about when the pool changes")
        return WaitEstimate(reason, words, None, None, None, basis)
    if position is None or position < 0:
        return WaitEstimate(reason, words, None, None, None, "Kueue does not list it as pending")
    seen = sorted(t for t in admissions if watched_since <= t <= now)
    recent = seen[-RECENT:]
    # the pace is measured from the admission before the counted ones (or the start of watching) to now, so a
    # line that has stalled since its last admission slows the estimate down
    start = seen[-RECENT - 1] if len(seen) > RECENT else watched_since
    watched = now - start
    if len(recent) < MIN_ADMISSIONS or watched < MIN_WATCHED:
        return WaitEstimate(reason, words, None, None, None,
                            f"{len(recent)} admission{'' if len(recent) == 1 else 's'} seen in "
                            f"{_span(watched)} is too little history")
    rate = len(recent) / watched
    needed = position + 1
    mean = needed / rate
    # the time for k more admissions at a known steady random pace spreads as 1/sqrt(k); the pace itself is
    # known to 1/sqrt(n); bursts scale the first by the gaps' coefficient of variation
    spread = math.sqrt((_burstiness(recent, start, now) ** 2) / needed + 1 / len(recent))
    low = mean * max(0.0, 1 - Z80 * spread)
    high = mean * (1 + Z80 * spread)
    return WaitEstimate(reason, words, mean, low, high,
                        f"{len(recent)} admissions in the last {_span(watched)}")
