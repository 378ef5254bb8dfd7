"""Where the wait from Shift-Enter to a cell's first line goes: one mark per phase, kept by the engine.

A :class:`Stopwatch` starts when the magic is entered; the engine, the backend (as :class:`Phase` events)
and the follower mark phases as they end; :meth:`Stopwatch.record` freezes them into a :class:`RunTiming`,
which ``%gpu_offload status --timing`` shows and the run's record keeps. Every mark is the engine's own
monotonic clock: the runner's clock may be another machine's, so what the runner measures arrives as
durations (``boot``: its process start to ``hello``; ``imports``: importing the cell's modules).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

PHASES = (
    "analysis",
    "bundle",
    "placement",
    "pod create",
    "submitted",
    "schedule",
    "container start",
    "runner start",
    "imports",
    "first line",
    "done",
)
"""Phases in the order a run passes them; each mark is when the phase *ended*. A backend without pods
(local) has no placement, pod create, schedule or container start; a warm session no runner start."""


@dataclass(frozen=True)
class Phase:
    """A backend's event: ``name`` (one of :data:`PHASES`) ended at ``at`` (``time.monotonic()``)."""

    name: str
    at: float


@dataclass(frozen=True)
class RunTiming:
    """A run's phases as seconds since Shift-Enter, in :data:`PHASES` order, plus what the runner measured."""

    marks: tuple[tuple[str, float], ...]
    runner_boot: float | None = None
    """Seconds from the runner process's start to its ``hello`` (interpreter and runner imports)."""
    runner_imports: float | None = None
    """Seconds the runner spent importing the cell's modules (0 when it had none)."""

    def at(self, phase: str) -> float | None:
        """Seconds from Shift-Enter to the end of ``phase``, ``None`` if the run did not pass it."""
        return dict(self.marks).get(phase)

    def steps(self) -> tuple[tuple[str, float], ...]:
        """Each phase with the seconds it took (from the previous mark)."""
        out, last = [], 0.0
        for name, offset in self.marks:
            out.append((name, offset - last))
            last = offset
        return tuple(out)

    def to_json(self) -> dict[str, object]:
        """What the run's record holds."""
        return {"marks": [[n, s] for n, s in self.marks],
                "runner_boot": self.runner_boot, "runner_imports": self.runner_imports}


def timing_from_json(data: object) -> RunTiming | None:
    """A :class:`RunTiming` back from :meth:`RunTiming.to_json`; ``None`` for anything else."""
    if not isinstance(data, dict):
        return None
    marks = data.get("marks")
    if not isinstance(marks, list):
        return None
    pairs = []
    for item in marks:
        if (not isinstance(item, list) or len(item) != 2 or item[0] not in PHASES
                or not isinstance(item[1], (int, float)) or isinstance(item[1], bool)):
            return None
        pairs.append((str(item[0]), float(item[1])))
    return RunTiming(tuple(pairs), _seconds(data.get("runner_boot")), _seconds(data.get("runner_imports")))


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


class Stopwatch:
    """Marks of one run (mutable while it runs; :meth:`record` is the frozen view)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.monotonic() if start is None else start
        self._marks: dict[str, float] = {}
        self.runner_boot: float | None = None
        self.runner_imports: float | None = None

    def mark(self, phase: str, at: float | None = None) -> None:
        """``phase`` ended now (or at ``at``); the first mark of a phase stands (a retry does not move it)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}: one of {', '.join(PHASES)}")
        self._marks.setdefault(phase, time.monotonic() if at is None else at)

    def has(self, phase: str) -> bool:
        """Whether ``phase`` is marked."""
        return phase in self._marks

    def record(self) -> RunTiming:
        """The marks so far, as seconds since the start, in phase order. A phase that another thread marked
        before an earlier phase's mark (the pod's scheduling, seen by the follower while ``submit`` had not yet
        returned to mark ``submitted``) bounds it: a phase ended no later than the phases after it, so no step
        is negative."""
        offsets = [(p, max(0.0, self._marks[p] - self.start)) for p in PHASES if p in self._marks]
        bounded: list[tuple[str, float]] = []
        ceiling = float("inf")
        for phase, offset in reversed(offsets):
            ceiling = min(ceiling, offset)
            bounded.append((phase, ceiling))
        return RunTiming(tuple(reversed(bounded)), self.runner_boot, self.runner_imports)


def describe_timing(timing: RunTiming | None) -> str:
    """Lines for ``%gpu_offload status --timing``."""
    if timing is None or not timing.marks:
        return "no run timed yet in this kernel (run a %%gpu_offload cell first)"
    lines = ["last run, from Shift-Enter:", f"  {'phase':<16}{'took':>10}{'at':>10}"]
    for (name, took), (_, offset) in zip(timing.steps(), timing.marks, strict=True):
        lines.append(f"  {name:<16}{_ms(took):>10}{_ms(offset):>10}")
    if timing.runner_boot is not None:
        lines.append(f"  runner process start to hello: {_ms(timing.runner_boot)}")
    if timing.runner_imports is not None:
        lines.append(f"  runner importing the cell's modules: {_ms(timing.runner_imports)}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"
