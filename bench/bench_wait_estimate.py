"""How far the queued cell's start estimate is from the real start, replaying the Alibaba GPU trace (issue 27).

The trace's GPU tasks (``default`` workload, ../shared/traces/) arrive at their creation time and hold their GPUs
for their traced lifetime (deletion - creation); a task asking for a share of a GPU gets a whole one, as the
project gives it. The pool is a fixed number of GPUs served strictly first in, first out (Kueue's
StrictFIFO with one flavor): the head starts as soon as enough GPUs are free, nothing overtakes it. The pools are
sized as shares of the trace's peak concurrent demand (the most GPUs its tasks held at once), so the smaller
the share the longer the line.

Each task that has to wait is asked for an estimate (``gpu_offload.engine.backends.kube.wait_estimate``) the
way the kernel asks: with its place in line, the admissions of the queue seen so far (the history starts with
the replay, as a hub or a long-lived kernel sees it) and reason ``quota``; at its arrival, then each time its
place halves (the kernel shows every change; the halvings keep the replay fast without favouring the head).
Figures per load: the absolute error |estimated - actual wait still ahead| (median, p90) in seconds and as a
share of the actual wait, how often the range held the actual start, and how often there was no estimate.
Issue 27's goal: the median absolute error at most 30 % of the actual wait.

Beside it, in the same replay, a candidate the kernel cannot run yet (:func:`pool_guess`, here only): it
simulates the line itself from what a hub watching every Workload of the ClusterQueue would know, never from
the future: the runs holding GPUs (their GPUs and how long they have run), the GPUs each run ahead asks for, the
pool's size, and the durations of the last 500 runs that ended. Each running run's remaining time is drawn from
the durations seen that exceed its elapsed time, each run ahead's duration from all of them; the line is served
first in, first out 21 times, and the estimate is the 40th percentile of the starts (a median of the wait,
leaning short because the error is counted relative to the actual wait). Its figures are labelled "pool model".

Third, in the same replay, the pool model by asks (:func:`asks_guess`): the same simulation, but each run's
duration is drawn from the durations of earlier runs that asked for the same thing (GPUs, share of a GPU, CPU,
memory and QoS class, the trace's nearest to a priority class: what a hub sees in each Workload's pod set),
when at least :data:`SAME_ASKS` of them ended, else from all runs, as before. A running run's remaining time is
drawn from those of its asks that ran longer than it has so far. Labelled "pool model by asks".
Run: ``.venv/bin/python bench/bench_wait_estimate.py``.
"""

from __future__ import annotations

import bisect
import heapq
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from alibaba_trace import NEVER, missing, read_tasks  # bench/: the script's folder is on sys.path
from harness import Run, percentile

from gpu_offload.engine.backends.kube.wait_estimate import QUOTA, RECENT, estimate

POOLS = (0.9, 0.8, 0.7)
"""The pool's GPUs as a share of the trace's peak concurrent demand (the GPUs its tasks held at once at most)."""
HISTORY = 500
"""The pool model draws durations from this many runs that ended last."""
DRAWS = 21
"""Simulations of the line per estimate of the pool model."""
QUANTILE = 0.4
"""The pool model's estimate: this quantile of its simulated starts."""
SAME_ASKS = 10
"""The pool model by asks draws a run's duration from runs of the same asks once this many of them ended."""

Asks = tuple[int, int, int, int, str]
"""What a run asked for: GPUs, thousandths of a GPU, CPU millicores, memory MiB, QoS class."""


@dataclass
class Waiting:
    arrived: int
    gpus: int
    hold: int
    asks: Asks
    samples: list[tuple[float, int, float | None, float | None, float | None, float | None, float | None]] = field(
        default_factory=list)
    """(time, position, estimate, low, high, pool model's estimate, by asks) at each estimate asked."""
    next_sample: int = -1
    """Sample again once the place is at most this."""


@dataclass(frozen=True)
class Replay:
    pool: int
    errors: list[float]
    relative: list[float]
    first_relative: list[float]
    covered: int
    without: int
    asked: int
    waits: list[float]
    pool_relative: list[float]
    asks_relative: list[float]


@dataclass
class Pool:
    """What the pool model reads: the pool's size, its running runs, the line, the durations seen."""

    gpus: int
    running: dict[int, tuple[float, int, Asks]] = field(default_factory=dict)
    """Per run holding GPUs: (when it started, its GPUs, its asks)."""
    ended: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    by_asks: dict[Asks, deque[float]] = field(default_factory=dict)
    """The durations of the last :data:`HISTORY` runs of each asks that ended."""
    draws: random.Random = field(default_factory=lambda: random.Random(27))
    asks_draws: random.Random = field(default_factory=lambda: random.Random(27))
    """The pool model by asks draws apart, so the pool model's own draws are those of the run before it."""

    def end(self, duration: float, asks: Asks) -> None:
        self.ended.append(duration)
        self.by_asks.setdefault(asks, deque(maxlen=HISTORY)).append(duration)


Tail = tuple[float, int, list[float], int]
"""A running run: how long it has run, its GPUs, the sorted durations its end is drawn from, and how many of
them it has outlived."""


def _simulated(pool: Pool, tails: list[Tail], line: list[tuple[int, list[float]]], now: float,
               draws: random.Random) -> float:
    """The :data:`QUANTILE` of :data:`DRAWS` simulated starts of the last run of ``line`` ((GPUs, the sorted
    durations its run is drawn from), head first), served first in, first out after the running ``tails``."""
    free0 = pool.gpus - sum(g for _, g, _ in pool.running.values())
    starts = []
    for _ in range(DRAWS):
        # a run longer than every duration seen is expected to run as long again
        ends = [(now + (seen[draws.randrange(k, len(seen))] - e if k < len(seen) else e), g)
                for e, g, seen, k in tails]
        heapq.heapify(ends)
        free, t = free0, now
        for need, seen in line:
            while free < need and ends:
                end, back = heapq.heappop(ends)
                free, t = free + back, max(t, end)
            free -= need
            heapq.heappush(ends, (t + seen[draws.randrange(len(seen))], need))
        starts.append(t - now)
    starts.sort()
    return starts[int(QUANTILE * len(starts))]


def pool_guess(pool: Pool, ahead: list[int], gpus: int, now: float) -> float | None:
    """The pool model's wait for a run of ``gpus`` behind runs asking ``ahead`` (head first); None under 3
    durations seen."""
    seen = sorted(pool.ended)
    if len(seen) < 3:
        return None
    tails = [(now - start, g, seen, bisect.bisect_right(seen, now - start)) for start, g, _ in pool.running.values()]
    return _simulated(pool, tails, [(need, seen) for need in [*ahead, gpus]], now, pool.draws)


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

    tails = []
    for start, g, run_asks in pool.running.values():
        seen = durations(run_asks)
        tails.append((now - start, g, seen, bisect.bisect_right(seen, now - start)))
    line = [(need, durations(a)) for need, a in [*ahead, (gpus, asks)]]
    return _simulated(pool, tails, line, now, pool.asks_draws)


def _ask(item: Waiting, position: int, now: float, admissions: list[float], pool: Pool,
         ahead: list[Waiting]) -> None:
    # the estimator reads only the last RECENT + 1 admissions: handing it those keeps the replay linear
    guess = estimate(position, admissions[-RECENT - 1:], 0.0, now, QUOTA)
    modelled = pool_guess(pool, [w.gpus for w in ahead], item.gpus, now)
    by_asks = asks_guess(pool, [(w.gpus, w.asks) for w in ahead], item.gpus, item.asks, now)
    item.samples.append((now, position, guess.seconds, guess.low, guess.high, modelled, by_asks))
    item.next_sample = position // 2 if position else -1


def replay(tasks: list[tuple[int, int, int, Asks]], pool: int) -> Replay:
    """Serve ``tasks`` (arrival, gpus, hold, asks) FIFO on ``pool`` GPUs, asking the estimators along the way."""
    free = pool
    running: list[tuple[int, int, int]] = []  # (end, gpus, run)
    seen = Pool(pool)
    line: deque[Waiting] = deque()
    admissions: list[float] = []
    started: list[tuple[Waiting, int]] = []
    arrivals = iter(tasks)
    upcoming = next(arrivals, None)
    runs = 0

    def ask(item: Waiting, position: int, now: int) -> None:
        _ask(item, position, now, admissions, seen, list(islice(line, position)))

    def admit(now: int) -> None:
        nonlocal free, runs
        moved = False
        while line and line[0].gpus <= free:
            item = line.popleft()
            free -= item.gpus
            runs += 1
            heapq.heappush(running, (now + item.hold, item.gpus, runs))
            seen.running[runs] = (now, item.gpus, item.asks)
            admissions.append(now)
            if item.samples:
                started.append((item, now))
            moved = True
        if moved:
            for position, item in enumerate(line):
                if item.samples and position <= item.next_sample:
                    ask(item, position, now)

    while upcoming is not None or running:
        if running and (upcoming is None or running[0][0] <= upcoming[0]):
            now, gpus, run = heapq.heappop(running)
            began, _, asks = seen.running.pop(run)
            seen.end(now - began, asks)
            free += gpus
            admit(now)
            continue
        assert upcoming is not None
        arrived, gpus, hold, asks = upcoming
        upcoming = next(arrivals, None)
        item = Waiting(arrived, gpus, hold, asks)
        line.append(item)
        admit(arrived)
        if line and line[-1] is item:
            ask(item, len(line) - 1, arrived)
    errors, relative, first, waits, modelled, by_asks = [], [], [], [], [], []
    covered = without = asked = 0
    for item, start in started:
        waits.append(start - item.arrived)
        for index, (when, _position, guess, low, high, model, own) in enumerate(item.samples):
            asked += 1
            ahead = start - when
            if model is not None and ahead > 0:
                modelled.append(abs(model - ahead) / ahead)
            if own is not None and ahead > 0:
                by_asks.append(abs(own - ahead) / ahead)
            if guess is None or low is None or high is None:
                without += 1
                continue
            errors.append(abs(guess - ahead))
            covered += low <= ahead <= high
            if ahead > 0:
                relative.append(abs(guess - ahead) / ahead)
                if index == 0:
                    first.append(abs(guess - ahead) / ahead)
    return Replay(pool, errors, relative, first, covered, without, asked, waits, modelled, by_asks)


def _peak(tasks: list[tuple[int, int, int, Asks]]) -> int:
    """The most GPUs the trace's tasks held at once."""
    changes = sorted([(arrived, gpus) for arrived, gpus, _, _ in tasks]
                     + [(arrived + hold, -gpus) for arrived, gpus, hold, _ in tasks])
    held = peak = 0
    for _, change in changes:
        held += change
        peak = max(peak, held)
    return peak


def main() -> int:
    problem = missing()
    if problem:
        print(f"skipped: {problem}")
        return 1
    tasks = sorted((t.created, max(1, t.gpus), t.deleted - t.created,
                    (t.gpus, t.gpu_milli, t.cpu_milli, t.memory_mib, t.qos))
                   for t in read_tasks("default") if t.deleted < NEVER and t.deleted >= t.created)
    peak = _peak(tasks)
    run = Run("wait_estimate", "Start estimate of a queued run vs its actual start, Alibaba trace FIFO replay")
    run.note(f"trace: {len(tasks)} GPU tasks of the default workload, at most {peak} GPUs held at once; estimates "
             f"use the last {RECENT} admissions, no estimate under 3 admissions or 60 s")
    for share in POOLS:
        pool = round(peak * share)
        result = replay(tasks, pool)
        tag = f"pool {pool} GPUs ({share:.0%} of peak)"
        run.figure(f"{tag} abs error", result.errors, "s")
        run.figure(f"{tag} abs error / actual wait", result.relative, "ratio")
        run.figure(f"{tag} abs error / actual wait, at arrival", result.first_relative, "ratio")
        run.figure(f"{tag} actual wait of queued tasks", result.waits, "s")
        run.note(f"{tag}: {len(result.waits)} of {len(tasks)} tasks waited; {result.asked} estimates asked, "
                 f"{result.without} without an estimate; abs error median {percentile(result.errors, 0.5):.0f} s, "
                 f"p90 {percentile(result.errors, 0.9):.0f} s; range held the start in "
                 f"{result.covered / max(1, len(result.errors)):.0%}")
        run.goal(f"{tag} median abs error / actual wait", percentile(result.relative, 0.5), 0.30, "x")
        run.figure(f"{tag} pool model: abs error / actual wait", result.pool_relative, "ratio")
        run.goal(f"{tag} pool model: median abs error / actual wait", percentile(result.pool_relative, 0.5),
                 0.30, "x")
        run.figure(f"{tag} pool model by asks: abs error / actual wait", result.asks_relative, "ratio")
        run.goal(f"{tag} pool model by asks: median abs error / actual wait",
                 percentile(result.asks_relative, 0.5), 0.30, "x")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
