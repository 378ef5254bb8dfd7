"""The pool models of bench_wait_estimate.py: estimates of a queued run's start that simulate the line from what a
hub watching every Workload of the ClusterQueue would know, never from the future.

What they read (:class:`Pool`): the pool's GPUs, the runs holding GPUs (when each started, its GPUs, its asks), the
GPUs each run ahead asks for, and the durations of the runs that ended. Each simulation draws every running run's
remaining time and every run ahead's duration, then serves the line first in, first out; the estimate is a point
of the simulated starts. The models differ in how they draw and which point they take:

- :func:`pool_guess` ("pool model"): a running run's remaining time drawn from the last :data:`HISTORY` durations
  seen that exceed its elapsed time, the 40th percentile of 21 starts.
- :func:`asks_guess` ("pool model by asks"): the same, drawing each run's duration from earlier runs of its asks.
- :func:`survival_guess` ("pool model, survival"): durations drawn from a Kaplan-Meier survival curve of the last
  :data:`HISTORY` runs *admitted*: those that ended, and those still running counted as lasting at least their
  elapsed time (the runs that ended last favour short runs: the long ones of the same days are still running).
- :func:`likeliest_guess` ("pool model, likeliest"): the pool model's draws (41 of them), and as the estimate the
  point that the most simulated starts lie within 30 % of (the goal's own tolerance), not a quantile.
- :func:`class_guess` ("pool model, survival by class"): as the survival model, with one Kaplan-Meier curve per
  class of request (:func:`request_class`: GPUs, a share of one or not, QoS, CPU shape) from the last
  :data:`HISTORY` runs of that class admitted, each running run's remaining time drawn from its class's curve past
  its elapsed time (the overall curve for a class with fewer than :data:`SAME_ASKS` ended).
- :func:`known_guess` (a diagnostic, no kernel or hub can run it): the running runs' true remaining times, only
  the line's durations drawn. It shows how much of the error is the running runs' unknown ends.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

HISTORY = 500
"""The models draw durations from this many runs that ended last."""
DRAWS = 21
"""Simulations of the line per estimate of the pool model."""
QUANTILE = 0.4
"""The pool model's estimate: this quantile of its simulated starts."""
SAME_ASKS = 10
"""The pool model by asks draws a run's duration from runs of the same asks once this many of them ended."""
LIKELY_DRAWS = 41
"""Simulations per estimate of the likeliest model (it picks a window, which wants more points than a quantile)."""
TOLERANCE = 0.3
"""The likeliest model's window: an estimate within this share of the start."""

Asks = tuple[int, int, int, int, str]
"""What a run asked for: GPUs, thousandths of a GPU, CPU millicores, memory MiB, QoS class."""
Draw = Callable[[random.Random], float]
"""Draws one duration (a running run's remaining time, or a run ahead's whole duration)."""


@dataclass
class Pool:
    """What the pool models read: the pool's size, its running runs, the durations seen."""

    gpus: int
    running: dict[int, tuple[float, int, Asks]] = field(default_factory=dict)
    """Per run holding GPUs: (when it started, its GPUs, its asks)."""
    ended: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    by_asks: dict[Asks, deque[float]] = field(default_factory=dict)
    """The durations of the last :data:`HISTORY` runs of each asks that ended."""
    cohort: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    """The last :data:`HISTORY` runs admitted, ended or not (a sample of durations that no length favours)."""
    lasted: dict[int, float] = field(default_factory=dict)
    """The duration of each run of the cohort that ended."""
    classes: dict[tuple[int, bool, str, int], deque[int]] = field(default_factory=dict)
    """The last :data:`HISTORY` runs admitted of each :func:`request_class`, ended or not."""
    durations: dict[int, float] = field(default_factory=dict)
    """Every ended run's duration (the class cohorts look theirs up)."""
    rngs: dict[str, random.Random] = field(default_factory=dict)
    """One random stream per model, so each model's draws are those of the run before it whatever the others do."""

    def admit(self, run: int, now: float, gpus: int, asks: Asks) -> None:
        self.running[run] = (now, gpus, asks)
        if len(self.cohort) == self.cohort.maxlen:
            self.lasted.pop(self.cohort[0], None)
        self.cohort.append(run)
        self.classes.setdefault(request_class(asks), deque(maxlen=HISTORY)).append(run)

    def end(self, run: int, now: float) -> None:
        began, _, asks = self.running.pop(run)
        duration = now - began
        if run in self.cohort:
            self.lasted[run] = duration
        self.ended.append(duration)
        self.durations[run] = duration
        self.by_asks.setdefault(asks, deque(maxlen=HISTORY)).append(duration)

    def rng(self, model: str) -> random.Random:
        return self.rngs.setdefault(model, random.Random(27))

    def free(self) -> int:
        return self.gpus - sum(g for _, g, _ in self.running.values())


def request_class(asks: Asks) -> tuple[int, bool, str, int]:
    """A coarse class of request: GPUs, whether it asks a share of one, QoS, and the CPU asked in powers of 4 cores
    (0: under 4, 1: 4-15, 2: 16-63, ...); exact asks split the history too thin (the pool model by asks)."""
    gpus, milli, cpu, _memory, qos = asks
    cores = max(1, cpu // 1000)
    return gpus, 0 < milli < 1000, qos, (cores.bit_length() - 1) // 2


def _starts(free0: int, tails: list[tuple[Draw, int]], line: list[tuple[int, Draw]], now: float,
            draws: int, rng: random.Random) -> list[float]:
    """``draws`` simulated starts (sorted, seconds from ``now``) of the last run of ``line`` ((GPUs, its duration's
    draw), head first), served first in, first out after the running ``tails`` ((remaining time's draw, GPUs))."""
    starts = []
    for _ in range(draws):
        ends = [(now + remaining(rng), g) for remaining, g in tails]
        heapq.heapify(ends)
        free, t = free0, now
        for need, duration in line:
            while free < need and ends:
                end, back = heapq.heappop(ends)
                free, t = free + back, max(t, end)
            free -= need
            heapq.heappush(ends, (t + duration(rng), need))
        starts.append(t - now)
    starts.sort()
    return starts


def _at_share(starts: list[float], q: float = QUANTILE) -> float:
    """The start at share ``q`` of ``starts`` (sorted), taken as it is (no interpolation between draws)."""
    return starts[int(q * len(starts))]


def likeliest(starts: list[float], tolerance: float = TOLERANCE) -> float:
    """The estimate that the most of ``starts`` (sorted) lie within ``tolerance`` of: an estimate ``e`` is within
    it of a start ``w`` when ``(1 - tolerance) w <= e <= (1 + tolerance) w``; the smallest such ``e`` wins ties."""
    best, count = starts[len(starts) // 2], 0
    for low in starts:
        e = (1 - tolerance) * low if low > 0 else 0.0
        # the starts e is within tolerance of: those from e / (1 + tolerance) to e / (1 - tolerance)
        held = (bisect.bisect_right(starts, e / (1 - tolerance)) - bisect.bisect_left(starts, e / (1 + tolerance))
                if e > 0 else starts.count(0.0))
        if held > count:
            best, count = e, held
    return best


def _empirical(seen: list[float], elapsed: float) -> Draw:
    """A running run's remaining time drawn from the durations ``seen`` (sorted) that exceed ``elapsed``; a run
    longer than every duration seen is expected to run as long again."""
    k = bisect.bisect_right(seen, elapsed)
    if k >= len(seen):
        return lambda _rng: elapsed
    return lambda rng: seen[rng.randrange(k, len(seen))] - elapsed


def _whole(seen: list[float]) -> Draw:
    return lambda rng: seen[rng.randrange(len(seen))]


def _pool_starts(pool: Pool, ahead: list[int], gpus: int, now: float, draws: int,
                 model: str) -> list[float] | None:
    """The pool model's ``draws`` start times of a run of ``gpus`` behind ``ahead``: each running run's end and
    each queued run's duration drawn from the durations seen (``model`` seeds the draws); None under 3 seen."""
    seen = sorted(pool.ended)
    if len(seen) < 3:
        return None
    tails = [(_empirical(seen, now - start), g) for start, g, _ in pool.running.values()]
    line = [(need, _whole(seen)) for need in [*ahead, gpus]]
    return _starts(pool.free(), tails, line, now, draws, pool.rng(model))


def pool_guess(pool: Pool, ahead: list[int], gpus: int, now: float) -> float | None:
    """The pool model's wait for a run of ``gpus`` behind runs asking ``ahead`` (head first); None under 3
    durations seen."""
    starts = _pool_starts(pool, ahead, gpus, now, DRAWS, "pool")
    return None if starts is None else _at_share(starts)


def asks_guess(pool: Pool, ahead: list[tuple[int, Asks]], gpus: int, asks: Asks, now: float) -> float | None:
    """The pool model by asks: as :func:`pool_guess`, each run's duration drawn from the runs of its own asks
    when :data:`SAME_ASKS` of them ended; None under 3 durations seen."""
    every = sorted(pool.ended)
    if len(every) < 3:
        return None
    known: dict[Asks, list[float]] = {}

    def durations(of: Asks) -> list[float]:
        if of not in known:
            own = pool.by_asks.get(of, ())
            known[of] = sorted(own) if len(own) >= SAME_ASKS else every
        return known[of]

    tails = [(_empirical(durations(a), now - start), g) for start, g, a in pool.running.values()]
    line = [(need, _whole(durations(a))) for need, a in [*ahead, (gpus, asks)]]
    return _at_share(_starts(pool.free(), tails, line, now, DRAWS, pool.rng("asks")))


@dataclass(frozen=True)
class Survival:
    """A Kaplan-Meier survival curve: ``times`` (ascending) at which runs ended, ``left[i]`` the share of runs
    lasting longer than ``times[i]``."""

    times: list[float]
    left: list[float]

    def __post_init__(self) -> None:
        # the curve descends: negated, it ascends, for the search of the first time at most a share is left
        object.__setattr__(self, "negated", [-s for s in self.left])

    @classmethod
    def of(cls, ended: list[float], running: list[float]) -> Survival:
        """From the durations of runs that ended and the elapsed times of runs still running (censored: each
        lasts at least that long)."""
        events = sorted([(d, 1) for d in ended] + [(e, 0) for e in running])
        at_risk, share = len(events), 1.0
        times: list[float] = []
        left: list[float] = []
        for when, ended_here in events:
            if ended_here:
                share *= 1 - 1 / at_risk
                if times and times[-1] == when:
                    left[-1] = share
                else:
                    times.append(when)
                    left.append(share)
            at_risk -= 1
        return cls(times, left)

    def share_beyond(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t)
        return 1.0 if i == 0 else self.left[i - 1]

    def remaining(self, elapsed: float) -> Draw:
        """A run that has lasted ``elapsed``: its remaining time drawn from the curve past ``elapsed``; where the
        curve ends above the draw (the runs known to last that long are still running) it is expected to last as
        long as the longest run that ended, and at least as long again as it has (the runs still running
        older than every ended run would otherwise make a draw as long as the oldest of them)."""
        beyond = self.share_beyond(elapsed)
        negated: list[float] = self.negated  # type: ignore[attr-defined]
        start = bisect.bisect_right(self.times, elapsed)
        past_the_curve = max((self.times[-1] if self.times else 0.0) - elapsed, elapsed)

        def draw(rng: random.Random) -> float:
            i = bisect.bisect_left(negated, -rng.random() * beyond, lo=start)
            return self.times[i] - elapsed if i < len(self.times) else past_the_curve

        return draw


def _survival_starts(pool: Pool, ahead: list[int], gpus: int, now: float, draws: int,
                     model: str) -> list[float] | None:
    if len(pool.ended) < 3:
        return None
    elapsed = [(now - start, g) for start, g, _ in pool.running.values()]
    # the last runs admitted: those that ended, and those still running as lasting at least so far
    cohort = [(pool.lasted.get(run), now - pool.running[run][0] if run in pool.running else None)
              for run in pool.cohort]
    curve = Survival.of([d for d, _ in cohort if d is not None], [e for d, e in cohort if d is None and e is not None])
    whole = curve.remaining(0.0)
    tails = [(curve.remaining(e), g) for e, g in elapsed]
    return _starts(pool.free(), tails, [(need, whole) for need in [*ahead, gpus]], now, draws, pool.rng(model))


def survival_guess(pool: Pool, ahead: list[int], gpus: int, now: float) -> float | None:
    starts = _survival_starts(pool, ahead, gpus, now, DRAWS, "survival")
    return None if starts is None else _at_share(starts)


def likeliest_guess(pool: Pool, ahead: list[int], gpus: int, now: float) -> float | None:
    """The pool model's draws (:data:`LIKELY_DRAWS` of them), the point the most starts lie within 30 % of."""
    starts = _pool_starts(pool, ahead, gpus, now, LIKELY_DRAWS, "likeliest")
    return None if starts is None else likeliest(starts)


def known_guess(pool: Pool, true_ends: list[tuple[float, int]], ahead: list[int], gpus: int,
                now: float) -> float | None:
    """Diagnostic only: the running runs' true ends (``(end, GPUs)``), the line's durations drawn as the pool
    model draws them."""
    seen = sorted(pool.ended)
    if len(seen) < 3:
        return None
    tails = [((lambda _rng, left=end - now: left), g) for end, g in true_ends]
    line = [(need, _whole(seen)) for need in [*ahead, gpus]]
    return _at_share(_starts(pool.free(), tails, line, now, DRAWS, pool.rng("known")))


def class_guess(pool: Pool, ahead: list[tuple[int, Asks]], gpus: int, asks: Asks, now: float) -> float | None:
    """The survival model by class of request (see the module's docstring); None under 3 durations seen."""
    if len(pool.ended) < 3:
        return None
    cohort = [(pool.lasted.get(run), now - pool.running[run][0] if run in pool.running else None)
              for run in pool.cohort]
    overall = Survival.of([d for d, _ in cohort if d is not None], [e for d, e in cohort if d is None and e is not None])
    curves: dict[tuple[int, bool, str, int], Survival] = {}

    def curve(of: Asks) -> Survival:
        key = request_class(of)
        if key not in curves:
            runs = pool.classes.get(key, ())
            ended = [pool.durations[r] for r in runs if r in pool.durations]
            curves[key] = overall if len(ended) < SAME_ASKS else Survival.of(
                ended, [now - pool.running[r][0] for r in runs if r in pool.running])
        return curves[key]

    tails = [(curve(a).remaining(now - start), g) for start, g, a in pool.running.values()]
    line = [(need, curve(a).remaining(0.0)) for need, a in [*ahead, (gpus, asks)]]
    return _at_share(_starts(pool.free(), tails, line, now, DRAWS, pool.rng("class")))
