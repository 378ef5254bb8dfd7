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

Beside it, in the same replay, the pool models (bench/pool_model.py): candidates that simulate the line from
what a hub watching every Workload of the ClusterQueue would know (the runs holding GPUs and how long they have
run, the GPUs each run ahead asks for, the pool's size, the durations of runs that ended), and a diagnostic that
knows the running runs' true ends, to show how much of the error is theirs.

Each estimate is counted three ways: every estimate asked (at arrival and at each halving of the place, as before;
the halvings give the head of the line as much weight as the rest of the wait), the estimate at arrival (the one a
waiting cell shows first; one per run), and the estimate at a moment drawn uniformly in the run's wait (what a user
glancing at the cell at a random time sees; one per run). Notes per pool break the best model's error down by place
in line and by wait.
Run: ``.venv/bin/python bench/bench_wait_estimate.py`` (``--pools 0.9,0.8``: only those pools; the 70 % one
takes the longest by far; ``--quick``: the 90 % pool alone, seconds).
"""

from __future__ import annotations

import heapq
import random
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from alibaba_trace import NEVER, missing, peak_gpus, read_tasks  # bench/: the script's folder is on sys.path
from harness import Run, percentile
from pool_model import (
    TOLERANCE,
    Asks,
    Pool,
    asks_guess,
    class_guess,
    known_guess,
    likeliest_guess,
    pool_guess,
    survival_guess,
)

from gpu_offload.engine.backends.kube.wait_estimate import QUOTA, RECENT, estimate

POOLS = (0.9, 0.8, 0.7)
"""The pool's GPUs as a share of the trace's peak concurrent demand (the GPUs its tasks held at once at most)."""
RATE = "rate model (kernel today)"
DIAGNOSTIC = "diagnostic: running runs' ends known"
"""Not a candidate: no kernel or hub knows when a running run ends."""
KINDS = ("every estimate", "at arrival", "at a random moment")


@dataclass
class Waiting:
    arrived: int
    gpus: int
    hold: int
    asks: Asks
    index: int
    samples: list[Sample] = field(default_factory=list)
    next_sample: int = -1
    """Sample again once the place is at most this."""


@dataclass(frozen=True)
class Sample:
    """One estimate asked: when, at which place, why (arrival, halving, moment), each model's estimate."""

    time: float
    position: int
    kind: str
    rate: tuple[float | None, float | None, float | None]
    """The kernel's estimate and its range."""
    models: dict[str, float | None]


@dataclass(frozen=True)
class Error:
    """One estimate against the start: its relative error, place, wait still ahead and how it was asked."""

    model: str
    kind: str
    relative: float
    position: int
    ahead: float


@dataclass(frozen=True)
class Replay:
    pool: int
    errors: list[float]
    """The rate model's absolute errors (s), every estimate."""
    covered: int
    without: int
    asked: int
    waits: list[float]
    relative: list[Error]


Model = Callable[[Pool, list[Waiting], Waiting, float, list[tuple[float, int]]], "float | None"]
MODELS: dict[str, Model] = {
    "pool model": lambda pool, ahead, item, now, _ends: pool_guess(pool, [w.gpus for w in ahead], item.gpus, now),
    "pool model by asks": lambda pool, ahead, item, now, _ends: asks_guess(
        pool, [(w.gpus, w.asks) for w in ahead], item.gpus, item.asks, now),
    "pool model, survival": lambda pool, ahead, item, now, _ends: survival_guess(
        pool, [w.gpus for w in ahead], item.gpus, now),
    "pool model, survival by class": lambda pool, ahead, item, now, _ends: class_guess(
        pool, [(w.gpus, w.asks) for w in ahead], item.gpus, item.asks, now),
    "pool model, likeliest": lambda pool, ahead, item, now, _ends: likeliest_guess(
        pool, [w.gpus for w in ahead], item.gpus, now),
    DIAGNOSTIC: lambda pool, ahead, item, now, ends: known_guess(pool, ends, [w.gpus for w in ahead], item.gpus,
                                                                  now),
}


def _ask(item: Waiting, position: int, now: float, kind: str, admissions: list[float], pool: Pool,
         ahead: list[Waiting], ends: list[tuple[float, int]]) -> None:
    # the estimator reads only the last RECENT + 1 admissions: handing it those keeps the replay linear
    guess = estimate(position, admissions[-RECENT - 1:], 0.0, now, QUOTA)
    item.samples.append(Sample(now, position, kind, (guess.seconds, guess.low, guess.high),
                               {name: model(pool, ahead, item, now, ends) for name, model in MODELS.items()}))
    if kind != "moment":
        item.next_sample = position // 2 if position else -1


class Line:
    """The FIFO replay of ``tasks`` (arrival, gpus, hold, asks) on ``pool`` GPUs; with ``estimates``, each waiting
    task is asked for estimates at its arrival, at each halving of its place and at the moments given (task index
    -> time)."""

    def __init__(self, tasks: list[tuple[int, int, int, Asks]], pool: int, estimates: bool,
                 moments: dict[int, float] | None = None) -> None:
        self.tasks, self.estimates = tasks, estimates
        self.free = pool
        self.running: list[tuple[int, int, int]] = []  # (end, gpus, run)
        self.seen = Pool(pool)
        self.line: deque[Waiting] = deque()
        self.admissions: list[float] = []
        self.starts: dict[int, int] = {}
        self.started: list[tuple[Waiting, int]] = []
        self.runs = 0
        self.moments = sorted((when, index) for index, when in (moments or {}).items())

    def ask(self, item: Waiting, position: int, now: float, kind: str) -> None:
        ends = [(end, gpus) for end, gpus, _ in self.running]
        _ask(item, position, now, kind, self.admissions, self.seen, list(islice(self.line, position)), ends)

    def admit(self, now: int) -> None:
        moved = False
        while self.line and self.line[0].gpus <= self.free:
            item = self.line.popleft()
            self.free -= item.gpus
            self.runs += 1
            heapq.heappush(self.running, (now + item.hold, item.gpus, self.runs))
            self.seen.admit(self.runs, now, item.gpus, item.asks)
            self.admissions.append(now)
            self.starts[item.index] = now
            if item.samples:
                self.started.append((item, now))
            moved = True
        if moved and self.estimates:
            for position, item in enumerate(self.line):
                if item.samples and position <= item.next_sample:
                    self.ask(item, position, now, "halving")

    def _moments_before(self, until: float) -> None:
        while self.moments and self.moments[0][0] < until:
            when, index = self.moments.pop(0)
            position = next((p for p, w in enumerate(self.line) if w.index == index), None)
            if position is not None:
                self.ask(self.line[position], position, when, "moment")

    def replay(self) -> None:
        arrivals = iter(enumerate(self.tasks))
        upcoming = next(arrivals, None)
        while upcoming is not None or self.running:
            if self.running and (upcoming is None or self.running[0][0] <= upcoming[1][0]):
                now, gpus, run = self.running[0]
                self._moments_before(now)
                heapq.heappop(self.running)
                self.seen.end(run, now)
                self.free += gpus
                self.admit(now)
                continue
            assert upcoming is not None
            index, (arrived, gpus, hold, asks) = upcoming
            self._moments_before(arrived)
            upcoming = next(arrivals, None)
            item = Waiting(arrived, gpus, hold, asks, index)
            self.line.append(item)
            self.admit(arrived)
            if self.estimates and self.line and self.line[-1] is item:
                self.ask(item, len(self.line) - 1, arrived, "arrival")


def replay(tasks: list[tuple[int, int, int, Asks]], pool: int) -> Replay:
    """Serve ``tasks`` FIFO on ``pool`` GPUs twice: once for the starts (a moment in each wait is drawn from
    them), then asking every model along the way."""
    plain = Line(tasks, pool, estimates=False)
    plain.replay()
    draws = random.Random(5)
    moments = {index: tasks[index][0] + draws.random() * (start - tasks[index][0])
               for index, start in sorted(plain.starts.items()) if start > tasks[index][0]}
    line = Line(tasks, pool, estimates=True, moments=moments)
    line.replay()
    errors, waits, relative = [], [], []
    covered = without = asked = 0
    for item, start in line.started:
        waits.append(start - item.arrived)
        for sample in item.samples:
            ahead = start - sample.time
            kinds = ("at a random moment",) if sample.kind == "moment" else (
                ("every estimate", "at arrival") if sample.kind == "arrival" else ("every estimate",))
            if ahead > 0:
                for name, value in [(RATE, sample.rate[0]), *sample.models.items()]:
                    if value is not None:
                        relative += [Error(name, kind, abs(value - ahead) / ahead, sample.position, ahead)
                                     for kind in kinds]
            if sample.kind == "moment":
                continue
            asked += 1
            guess, low, high = sample.rate
            if guess is None or low is None or high is None:
                without += 1
                continue
            errors.append(abs(guess - ahead))
            covered += low <= ahead <= high
    return Replay(pool, errors, covered, without, asked, waits, relative)


PLACES = ((0, 0, "the head"), (1, 3, "2nd-4th"), (4, 15, "5th-16th"), (16, 10**9, "17th on"))
WAITS = ((0, 60, "under 1 min"), (60, 900, "1-15 min"), (900, 3600, "15 min-1 h"), (3600, 1e18, "over 1 h"))


def _breakdown(errors: list[Error], tag: str, run: Run) -> None:
    """Where the error is: the median relative error and the share within the tolerance, by place and by wait."""
    for label, key, groups in (("place in line", lambda e: e.position, PLACES),
                               ("wait still ahead", lambda e: e.ahead, WAITS)):
        parts = []
        for low, high, name in groups:
            part = [e.relative for e in errors if low <= key(e) <= high and not (high == 60 and key(e) == 60)]
            if part:
                within = sum(r <= TOLERANCE for r in part) / len(part)
                parts.append(f"{name} {percentile(part, 0.5):.2f} ({within:.0%} within 30 %, {len(part)})")
        run.note(f"{tag}: by {label}: " + "; ".join(parts))


def main(argv: list[str]) -> int:
    shares = POOLS
    if argv[:1] == ["--pools"] and len(argv) == 2:
        # the 70 % pool asks some 25,000 estimates of every model: on a loaded machine, the others alone
        shares = tuple(float(x) for x in argv[1].split(","))
    elif argv[:1] == ["--quick"] and len(argv) == 1:
        shares = (0.9,)  # the 64-GPU pool: some 40 runs wait, a few minutes
    elif argv:
        print("usage: bench_wait_estimate.py [--pools 0.9,0.8 | --quick]")
        return 2
    problem = missing()
    if problem:
        print(f"skipped: {problem}")
        return 1
    tasks = sorted((t.created, max(1, t.gpus), t.deleted - t.created,
                    (t.gpus, t.gpu_milli, t.cpu_milli, t.memory_mib, t.qos))
                   for t in read_tasks("default") if t.deleted < NEVER and t.deleted >= t.created)
    peak = peak_gpus(tasks)
    run = Run("wait_estimate", "Start estimate of a queued run vs its actual start, Alibaba trace FIFO replay")
    run.note(f"trace: {len(tasks)} GPU tasks of the default workload, at most {peak} GPUs held at once; estimates "
             f"use the last {RECENT} admissions, no estimate under 3 admissions or 60 s")
    for share in shares:
        pool = round(peak * share)
        result = replay(tasks, pool)
        tag = f"pool {pool} GPUs ({share:.0%} of peak)"
        run.figure(f"{tag} abs error", result.errors, "s")
        run.figure(f"{tag} actual wait of queued tasks", result.waits, "s")
        run.note(f"{tag}: {len(result.waits)} of {len(tasks)} tasks waited; {result.asked} estimates asked, "
                 f"{result.without} without an estimate; abs error median {percentile(result.errors, 0.5):.0f} s, "
                 f"p90 {percentile(result.errors, 0.9):.0f} s; range held the start in "
                 f"{result.covered / max(1, len(result.errors)):.0%}")
        for name in (RATE, *MODELS):
            for kind in KINDS:
                ratios = [e.relative for e in result.relative if e.model == name and e.kind == kind]
                label = f"{tag} {name}: abs error / actual wait, {kind}"
                run.figure(label, ratios, "ratio")
                run.goal(f"{label}: median", percentile(ratios, 0.5), 0.30, "x")
        for name in ("pool model", "pool model, likeliest"):
            _breakdown([e for e in result.relative if e.model == name and e.kind == "every estimate"],
                       f"{tag} {name}, every estimate", run)
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
