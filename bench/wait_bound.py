"""What a start estimate can know, on the sessions trace replay (bench_wait_bound.py): the replay's pool watched at
every wait, an oracle that knows every running run's true end, the ends the product itself knows, and the best any
estimator mapping a class of queue states to one value can do.

A *wait* is a pod that could not start when it was created (a trace pod, a session pod, a one-shot cell; a pod
requeued after a preemption counts again). At that moment (what a waiting cell shows first) the watcher records:

- the kernel's estimate (``wait_estimate.estimate`` of the tree, from the last admissions, as the replay's pool asks);
- the oracle's: the line replayed forward from this moment with every running pod leaving at its true departure
  (its end, idle release or preemption, from a first replay of the same deterministic run) and every pod ahead
  holding its GPUs for as long as it really did; the pods that arrive later are unknown to it, so what is left of
  its error is theirs (a later higher-priority arrival, a smaller pod passing under BestEffortFIFO);
- what the product knows of ends (:class:`KnownEnd`): an idle session pod is released at its last cell's
  end plus its idle timeout unless a cell comes first, and a protected session pod may be preempted by a higher
  class once its protection ends; both are times the kernel set, so it could publish them.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from session_flow import Sessions
from session_pool import Pod, Session, Shot, Trace
from session_rules import CLASSES, Rules

TOLERANCE = 0.30
"""Issue 27's goal: the estimate within 30 % of the actual wait (a median error of 30 % is half the waits within)."""


@dataclass(frozen=True)
class Wait:
    """One pod that waited, as seen at ``created`` (when it was created, or a moment in its wait), and when it
    really started."""

    pod: int
    user: bool
    """A notebook user's pod (a session's or a one-shot cell's), not a trace pod."""
    priority: int
    gpus: int
    position: int
    created: float
    rate: tuple[float | None, float | None, float | None]
    """The kernel's estimate (seconds ahead) and its range; None: no estimate."""
    oracle: float
    known: float | None
    """The product's known-ends bound, seconds ahead; None: no end it knows frees enough GPUs."""
    started: float = math.nan

    @property
    def actual(self) -> float:
        return self.started - self.created


@dataclass(frozen=True)
class KnownEnd:
    """GPUs of a running pod that the product knows will be free for a waiting run at a set time: a session pod
    idle since its last cell is released at that cell's end plus its idle timeout (unless a cell comes first), and
    a protected session pod of a lower own class may be preempted once its protection ends. The kernel set both."""

    at: float
    gpus: int
    why: str


def known_start(needed: int, free: int, ends: Sequence[KnownEnd]) -> KnownEnd | None:
    """The first known end at which ``needed`` GPUs (those of the runs ahead in line and this run's) are free, with
    ``free`` GPUs free (or preemptible by this run's class) now; None when the known ends never free enough. Unknown
    ends can only come sooner, and an idle session's next cell or a later arrival can take the GPUs, so it is the
    start if nothing else happens."""
    if needed <= free:
        return None  # nothing to wait for as far as the known ends go
    total = free
    for end in sorted(ends, key=lambda e: e.at):
        total += end.gpus
        if total >= needed:
            return end
    return None


def oracle_start(now: float, free: int, departures: Sequence[tuple[float, int]],
                 ahead: Sequence[tuple[int, float]], gpus: int) -> float:
    """When a pod asking ``gpus`` starts if the running pods leave at ``departures`` (time, GPUs) and the pods
    ``ahead`` of it (GPUs, how long each holds them once admitted), in line order, are admitted first come first
    served with smaller ones passing (BestEffortFIFO); nothing else arrives."""
    events = list(departures)
    heapq.heapify(events)
    line = [*ahead, (gpus, math.inf)]
    mine = len(line) - 1
    done = [False] * len(line)
    first, t = 0, now
    while True:
        i = first
        while i <= mine and free > 0:
            asks, hold = line[i]
            if not done[i] and asks <= free:
                if i == mine:
                    return t
                free -= asks
                done[i] = True
                heapq.heappush(events, (t + hold, asks))
            i += 1
        while done[first]:
            first += 1  # the line's head moves past the admitted (mine is never done)
        if not events:
            return math.inf
        t, freed = heapq.heappop(events)
        free += freed
        while events and events[0][0] <= t:
            free += heapq.heappop(events)[1]


class Watched(Sessions):
    """The replay's pool, recording every wait at its start and again at a moment drawn uniformly in it (what a user
    glancing at the waiting cell sees then); the ``first`` replay of the same run (when each pod was created,
    admitted and left) makes the oracle and places the moments. Looking changes nothing: a moment's event takes no
    number of the replay's (pod ids stay those of the first replay) and is followed by no admission round."""

    def __init__(self, gpus: int, rules: Rules, first: Watched | None, seed: int = 5) -> None:
        super().__init__(gpus, rules, check=False)
        self.departures = first.left if first is not None else {}
        self.first_admitted = first.admitted_at if first is not None else {}
        self.left: dict[int, float] = {}
        self.admitted_at: dict[int, float] = {}
        self.created: dict[int, float] = {}
        self.fresh: list[Pod] = []
        self.waits: dict[int, Wait] = {}
        self.moments: dict[int, Wait] = {}
        if first is not None:
            draws = random.Random(seed)
            for n, (pod_id, admitted) in enumerate(sorted(first.admitted_at.items())):
                created = first.created[pod_id]
                if admitted > created:
                    heapq.heappush(self.events, (created + draws.random() * (admitted - created), -1 - n,
                                                 self.on_moment, (pod_id,)))

    def run(self) -> None:
        while self.events:
            now, seq, handler, args = heapq.heappop(self.events)
            handler(now, *args)
            if seq >= 0:  # a moment only looks
                self.schedule(now)

    def on_moment(self, now: float, pod_id: int) -> None:
        pod = next((p for _, p in self.pending if p.id == pod_id), None)
        if pod is not None:
            self.moments[pod_id] = self._seen(pod, now)

    def create(self, now: float, owner: object, gpus: int, waits_at: str, protected_at: str = "",
               lowers_to: str = "", protection: float = 0.0) -> Pod:
        pod = super().create(now, owner, gpus, waits_at, protected_at, lowers_to, protection)
        self.created[pod.id] = now
        self.fresh.append(pod)
        return pod

    def end(self, pod: Pod, now: float) -> float:
        self.left[pod.id] = now
        return super().end(pod, now)

    def _admit(self, pod: Pod, now: float) -> None:
        self.admitted_at[pod.id] = now
        for seen in (self.waits, self.moments):
            wait = seen.get(pod.id)
            if wait is not None:
                seen[pod.id] = Wait(**{**wait.__dict__, "started": now})
        super()._admit(pod, now)

    def schedule(self, now: float) -> None:
        super().schedule(now)
        fresh, self.fresh = self.fresh, []
        if not self.departures:
            return  # the first replay: only the departures are wanted
        for pod in fresh:
            if pod.admitted is None:
                self.waits[pod.id] = self._seen(pod, now)

    def _hold(self, pod_id: int) -> float:
        """How long a pending pod holds its GPUs once admitted (from the first replay)."""
        admitted, left = self.first_admitted.get(pod_id), self.departures.get(pod_id)
        return math.inf if admitted is None or left is None else left - admitted

    def _seen(self, pod: Pod, now: float) -> Wait:
        position = next(k for k, (_, p) in enumerate(self.pending) if p.id == pod.id)
        ahead = [p for _, p in self.pending[:position]]
        guess = self.rules.estimate_range(position, self.admissions[-21:], now)
        oracle = oracle_start(now, self.free, [(self.departures.get(p.id, math.inf), p.gpus)
                                               for p in self.running.values()],
                              [(p.gpus, self._hold(p.id)) for p in ahead], pod.gpus) - now
        mine = pod.priority(now)
        now_free = self.free + sum(p.gpus for p in self.running.values() if p.priority(now) < mine)
        found = known_start(sum(p.gpus for p in ahead) + pod.gpus, now_free, self.known_ends(now, mine))
        known = None if found is None else max(0.0, found.at - now)
        return Wait(pod.id, not isinstance(pod.owner, Trace), pod.priority(now), pod.gpus, position, now, guess,
                    oracle, known)

    def known_ends(self, now: float, priority: int) -> list[KnownEnd]:
        """The running pods' GPUs the product knows will be free for a run of class ``priority``, and when: idle
        session pods at their release, protected ones of a lower own class when their protection ends."""
        events = []
        for p in self.running.values():
            if p.priority(now) < priority:
                continue  # preemptible now: counted as free
            owner = p.owner
            if isinstance(owner, Session) and owner.segment[0] == "idle":
                timeout = self.rules.idle_timeout(f"s{owner.user.index}", owner.user.idle_ask)
                if timeout > 0:
                    events.append(KnownEnd(owner.segment[1] + timeout, p.gpus, "idle release"))
                    continue
            if p.protection > 0 and p.admitted is not None and CLASSES[p.lowers_to] < priority:
                events.append(KnownEnd(p.admitted + p.protection, p.gpus, "protection end"))
        return events


def kind_of(owner: object) -> str:
    return "trace" if isinstance(owner, Trace) else "one-shot" if isinstance(owner, Shot) else "session"


def within(estimate: float | None, actual: float) -> bool:
    return estimate is not None and abs(estimate - actual) <= TOLERANCE * actual


def relative(estimate: float | None, actual: float) -> float:
    """The error over the actual wait; an absent estimate counts as infinitely wrong (it told the user nothing)."""
    return math.inf if estimate is None else abs(estimate - actual) / actual


def best_value(waits: Sequence[float]) -> tuple[float, int]:
    """The single estimate that lands within 30 % of the most of ``waits``, and how many: ``v`` is within 30 % of
    ``w`` exactly when ``v / 1.3 <= w <= v / 0.7``, a window of fixed ratio, slid over the sorted waits."""
    ordered = sorted(waits)
    best, count, j = 0.0, 0, 0
    for i, low in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] <= low * (1 + TOLERANCE) / (1 - TOLERANCE):
            j += 1
        if j - i > count:
            best, count = low * (1 + TOLERANCE), j - i
    return best, count


def median(values: Sequence[float]) -> float:
    """The median, an infinite error (no estimate) counting as any other: inf when it reaches the middle."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def class_bound(waits: Sequence[Wait], key: Callable[[Wait], object]) -> tuple[list[float], list[float], int]:
    """The errors over the actual wait of the best one value per class of ``key`` (the one within 30 % of the
    most waits of its class): fitted on every wait (a bound: no estimator that sees only ``key`` does better on
    this replay), and fitted on the even waits, scored on the odd ones and the other way round (what fitting such
    values really reaches); and the number of classes."""
    classes: dict[object, list[Wait]] = {}
    for w in waits:
        classes.setdefault(key(w), []).append(w)
    fitted, held = [], []
    for members in classes.values():
        value = best_value([w.actual for w in members])[0]
        fitted += [relative(value, w.actual) for w in members]
        halves = (members[0::2], members[1::2])
        for fit, score in (halves, halves[::-1]):
            guess = best_value([w.actual for w in fit])[0] if fit else None
            held += [relative(guess, w.actual) for w in score]
    return fitted, held, len(classes)


HISTORY = 200
"""The online model keeps the last this many waits of each class."""
MIN_HISTORY = 10
"""Fewer past waits in a class than this: the online model falls back to the kernel's estimate."""


@dataclass(frozen=True)
class Online:
    """The online model's estimate of one wait and its range (the 10th to 90th percentile of its class's past
    waits), or the kernel's where its class has too little history."""

    wait: Wait
    guess: float | None
    low: float | None
    high: float | None
    own: bool
    """From the class's history (not the kernel's fallback)."""


def online(waits: Sequence[Wait], key: Callable[[Wait], object]) -> list[Online]:
    """A model a hub watching every Workload could run: each wait is estimated, when it starts waiting, by the best
    one value of the waits of its class that had already started by then (their actual waits are known), the last
    :data:`HISTORY` of them; nothing of the wait itself or of the future is used."""
    history: dict[object, list[float]] = {}
    finished: list[tuple[float, int, Wait]] = []
    out = []
    for n, w in enumerate(sorted(waits, key=lambda w: (w.created, w.pod))):
        while finished and finished[0][0] <= w.created:
            _, _, done = heapq.heappop(finished)
            history.setdefault(key(done), []).append(done.actual)
            del history[key(done)][:-HISTORY]
        past = history.get(key(w), [])
        if len(past) >= MIN_HISTORY:
            ordered = sorted(past)
            low, high = ordered[len(ordered) // 10], ordered[(len(ordered) * 9) // 10]
            out.append(Online(w, best_value(past)[0], low, high, True))
        else:
            out.append(Online(w, *w.rate, False))
        heapq.heappush(finished, (w.started, n, w))
    return out


def bucket(seconds: float | None) -> int | None:
    """A factor-of-two bucket of a time (None stays None)."""
    return None if seconds is None or math.isinf(seconds) else int(math.log2(max(seconds, 1.0)))


def place(position: int) -> str:
    return "head" if position == 0 else "2-4" if position <= 3 else "5-16" if position <= 15 else "17+"
