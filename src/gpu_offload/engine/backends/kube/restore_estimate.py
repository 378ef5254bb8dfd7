"""How long a session's restore should take, from this kernel's own restores and checkpoints (a pure module: no
I/O, no clock).

A restore moves a checkpoint's bytes from the user's storage into the new runner and unpickles them; a
checkpoint moves them the other way. Their time is a fixed part (a command and its answer through the pod's
attach and log stream, the object's first byte) plus a part that grows with the size. Each one this kernel
timed is a point (bytes, seconds); a line through the recent points (least squares, both parts kept at 0 or
more) gives the estimate, and how far the points sit from that line gives its range. Restores are the better
guide; while this kernel has restored nothing, its checkpoints are used, and said to be. With no point at all, or
a checkpoint far larger than any timed one (a line drawn through small ones mostly measures the fixed part),
there is no estimate, said so rather than made up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ....liqo_peering.wording import duration

RESTORE, CHECKPOINT = "restore", "checkpoint"
KEPT = 8
"""Only the last this many of each kind count: the recent pace of this kernel's storage and donors."""
STRETCH = 4.0
"""No estimate for a checkpoint more than this many times the largest one timed."""


@dataclass(frozen=True)
class Timed:
    """One restore or checkpoint this kernel timed: its bytes and its seconds."""

    size: int
    seconds: float


def size_words(size: int) -> str:
    """``12.3 MiB``, ``40 KiB``, ``312 bytes``."""
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    if size >= 2**10:
        return f"{size / 2**10:.0f} KiB"
    return f"{size} bytes"


class Pace:
    """The restores and checkpoints this kernel timed, the last :data:`KEPT` of each (the keeper holds one)."""

    def __init__(self) -> None:
        self._timed: dict[str, deque[Timed]] = {RESTORE: deque(maxlen=KEPT), CHECKPOINT: deque(maxlen=KEPT)}

    def add(self, kind: str, size: object, seconds: float) -> None:
        """Record one timed ``kind`` of ``size`` bytes (a manifest's: anything but a non-negative int is
        ignored)."""
        if type(size) is int and size >= 0 and seconds > 0:
            self._timed[kind].append(Timed(size, seconds))

    def of(self, kind: str) -> tuple[Timed, ...]:
        return tuple(self._timed[kind])


@dataclass(frozen=True)
class RestoreEstimate:
    """How long a restore of ``size`` bytes should take, or why there is no estimate."""

    size: int
    seconds: float | None
    low: float | None
    high: float | None
    basis: str
    """What the estimate rests on, or why there is none."""

    def text(self) -> str:
        """``it should take about 4 s (between 3 s and 6 s), from this kernel's last 3 restores (2.5 MiB/s)``."""
        if self.seconds is None:
            return f"no estimate of its time yet: {self.basis}"
        span = ""
        if self.low is not None and self.high is not None and _said(self.low) != _said(self.high):
            span = f" (between {_said(self.low)} and {_said(self.high)})"
        about = "under 1 s" if self.seconds < 0.5 else f"about {_said(self.seconds)}"
        return f"it should take {about}{span}, from {self.basis}"


def _said(seconds: float) -> str:
    return "under 1 s" if seconds < 0.5 else duration(seconds)


def _line(points: Sequence[Timed]) -> tuple[float, float]:
    """The fixed seconds and the seconds per byte of the least-squares line through ``points``, each at least 0."""
    n = len(points)
    mean_x = sum(p.size for p in points) / n
    mean_y = sum(p.seconds for p in points) / n
    var = sum((p.size - mean_x) ** 2 for p in points)
    total = sum(p.size for p in points)
    if var > 0:
        per_byte = max(0.0, sum((p.size - mean_x) * (p.seconds - mean_y) for p in points) / var)
        fixed = mean_y - per_byte * mean_x
        if fixed >= 0:
            return fixed, per_byte
    # one size only, or a line that would start below 0 s: all of the time is taken to grow with the size,
    # which overestimates larger restores rather than promising them too soon
    return (0.0, sum(p.seconds for p in points) / total) if total else (mean_y, 0.0)


def estimate(size: int, restores: Sequence[Timed], checkpoints: Sequence[Timed],
             imports: Sequence[str] = ()) -> RestoreEstimate:
    """The time a restore of ``size`` bytes should take given this kernel's timed ``restores`` and
    ``checkpoints`` (the restores are used when there are any). ``imports``: the modules the state needs that a
    fresh runner imports before it can unpickle it (torch takes seconds): an earlier restore's time holds them,
    a checkpoint's does not, and the words say so."""
    points, kind = (restores, "restore") if restores else (checkpoints, "checkpoint")
    if not points:
        return RestoreEstimate(size, None, None, None,
                               "this kernel has not restored or timed a checkpoint before (this is the first)")
    largest = max(p.size for p in points)
    whose = f"this kernel's last {len(points)} {kind}s" if len(points) > 1 else f"this kernel's one {kind}"
    if size > STRETCH * max(largest, 1):
        return RestoreEstimate(size, None, None, None,
                               f"{whose} moved at most {size_words(largest)}, too little to tell the pace of "
                               f"{size_words(size)}")
    fixed, per_byte = _line(points)
    mean = fixed + per_byte * size
    low = high = None
    if len(points) > 1:
        # how far the timed ones sat from the line, applied to this one
        ratios = [p.seconds / (fixed + per_byte * p.size) for p in points if fixed + per_byte * p.size > 0]
        if ratios:
            low, high = mean * min(ratios), mean * max(ratios)
    rate = sum(p.size for p in points) / sum(p.seconds for p in points)
    basis = f"{whose} ({size_words(int(rate))}/s)"
    if kind == "checkpoint":
        basis += " as it has restored none yet: a restore moves the bytes a checkpoint wrote"
        if imports:
            basis += f"; not counted: the new runner's import of {', '.join(imports)}"
    return RestoreEstimate(size, mean, low, high, basis)
