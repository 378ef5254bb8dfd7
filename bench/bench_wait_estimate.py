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
Run: ``.venv/bin/python bench/bench_wait_estimate.py``.
"""

from __future__ import annotations

import heapq
import sys
from collections import deque
from dataclasses import dataclass, field

from alibaba_trace import NEVER, missing, read_tasks  # bench/: the script's folder is on sys.path
from harness import Run, percentile

from gpu_offload.engine.backends.kube.wait_estimate import QUOTA, RECENT, estimate

POOLS = (0.9, 0.8, 0.7)
"""The pool's GPUs as a share of the trace's peak concurrent demand (the GPUs its tasks held at once at most)."""


@dataclass
class Waiting:
    arrived: int
    gpus: int
    hold: int
    samples: list[tuple[float, int, float | None, float | None, float | None]] = field(default_factory=list)
    """(time, position, estimate, low, high) at each estimate asked."""
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


def _ask(item: Waiting, position: int, now: float, admissions: list[float]) -> None:
    # the estimator reads only the last RECENT + 1 admissions: handing it those keeps the replay linear
    guess = estimate(position, admissions[-RECENT - 1:], 0.0, now, QUOTA)
    item.samples.append((now, position, guess.seconds, guess.low, guess.high))
    item.next_sample = position // 2 if position else -1


def replay(tasks: list[tuple[int, int, int]], pool: int) -> Replay:
    """Serve ``tasks`` (arrival, gpus, hold) FIFO on ``pool`` GPUs, asking the estimator along the way."""
    free = pool
    running: list[tuple[int, int]] = []  # (end, gpus)
    line: deque[Waiting] = deque()
    admissions: list[float] = []
    started: list[tuple[Waiting, int]] = []
    arrivals = iter(tasks)
    upcoming = next(arrivals, None)

    def admit(now: int) -> None:
        nonlocal free
        moved = False
        while line and line[0].gpus <= free:
            item = line.popleft()
            free -= item.gpus
            heapq.heappush(running, (now + item.hold, item.gpus))
            admissions.append(now)
            if item.samples:
                started.append((item, now))
            moved = True
        if moved:
            for position, item in enumerate(line):
                if item.samples and position <= item.next_sample:
                    _ask(item, position, now, admissions)

    while upcoming is not None or running:
        if running and (upcoming is None or running[0][0] <= upcoming[0]):
            now, gpus = heapq.heappop(running)
            free += gpus
            admit(now)
            continue
        assert upcoming is not None
        arrived, gpus, hold = upcoming
        upcoming = next(arrivals, None)
        item = Waiting(arrived, gpus, hold)
        line.append(item)
        admit(arrived)
        if line and line[-1] is item:
            _ask(item, len(line) - 1, arrived, admissions)
    errors, relative, first, waits = [], [], [], []
    covered = without = asked = 0
    for item, start in started:
        waits.append(start - item.arrived)
        for index, (when, _position, guess, low, high) in enumerate(item.samples):
            asked += 1
            ahead = start - when
            if guess is None or low is None or high is None:
                without += 1
                continue
            errors.append(abs(guess - ahead))
            covered += low <= ahead <= high
            if ahead > 0:
                relative.append(abs(guess - ahead) / ahead)
                if index == 0:
                    first.append(abs(guess - ahead) / ahead)
    return Replay(pool, errors, relative, first, covered, without, asked, waits)


def _peak(tasks: list[tuple[int, int, int]]) -> int:
    """The most GPUs the trace's tasks held at once."""
    changes = sorted([(arrived, gpus) for arrived, gpus, _ in tasks]
                     + [(arrived + hold, -gpus) for arrived, gpus, hold in tasks])
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
    tasks = sorted((t.created, max(1, t.gpus), t.deleted - t.created)
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
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
