"""The pool of bench_sessions_replay.py: the trace's pods and the notebook users' pods on a fixed number of GPUs,
admitted the way the project's ClusterQueue admits them, with the product's decisions (session_rules.Rules)
asked at every turn.

Kueue as the project sets it up, simplified: ``BestEffortFIFO`` (pending pods by priority, then by creation; one
that does not fit is passed over) and ``withinClusterQueue: LowerPriority`` (a pending pod that does not fit
preempts running pods of a lower priority, lowest first and newest first, when that frees enough GPUs). Fair
sharing between namespaces, flavors and the grace period of a preempted pod are left out. A running session
pod's priority is its class *now*: the class it started at until its protection ends, then its own.
The trace's ``LS`` and ``Guaranteed`` pods run at ``interactive``, the others at ``batch``; a preempted trace pod is
requeued whole (as Kueue requeues a Job), its work so far lost in every tree.
"""

from __future__ import annotations

import bisect
import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from session_rules import CLASSES, Rules
from session_users import OneShot, SessionUser

RESTORE = 15.0
"""Seconds a resumed session's new runner spends restoring its checkpoint (GPU held, the cell waits)."""


@dataclass
class Pod:
    id: int
    owner: Any
    gpus: int
    created: float
    waits_at: str
    protected_at: str
    lowers_to: str
    protection: float
    admitted: float | None = None

    def priority(self, now: float) -> int:
        """The class a pod waits in line at, runs at in its protection, and runs at after."""
        if self.admitted is None:
            return CLASSES[self.waits_at]
        if self.protection > 0 and now < self.admitted + self.protection:
            return CLASSES[self.protected_at]
        return CLASSES[self.lowers_to]


@dataclass
class Trace:
    index: int
    hold: float
    priority: str


@dataclass
class Shot:
    user: OneShot
    rerun_before: bool = False
    started: float = 0.0
    done: bool = False
    failed: bool = False


@dataclass
class Session:
    user: SessionUser
    cell: int = 0
    pod: Pod | None = None
    epoch: int = 0
    """Bumped whenever a scheduled cell end or idle release of this session stops counting."""
    submitted: float | None = None
    """When the cell now waiting for a pod (or restore) was sent."""
    running: tuple[float, float, bool] | None = None
    """(since, GPU seconds, a cell run again) of the cell the pod runs."""
    redo: list[float] = field(default_factory=list)
    """Cells to run again before the next one: their results were lost with the pod."""
    state_cells: list[float] = field(default_factory=list)
    """The GPU seconds of each run whose results the variables hold (what a lost state costs to run again)."""
    segment: tuple[str, float] = ("", 0.0)
    """What the pod does since when: ``ran``, ``restore``, ``idle`` (``""``: nothing booked)."""
    ended_by: str = ""
    """Why the last pod ended with the state in it (``preemption`` / ``idle release``), until the next pod."""
    idle_since: float | None = None
    released: tuple[float, int] | None = None
    done_cells: int = 0
    cut: int = 0
    """Preemptions in a row since the user's last cell ended (the user gives up at :data:`GIVE_UP`)."""
    gave_up: bool = False
    over: bool = False
    ledger: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("held", "ran", "restore", "idle", "done", "partial lost"), 0.0))


@dataclass
class Tally:
    """What the replay measures (GPU seconds unless named otherwise)."""

    returned: float = 0.0
    resumed: dict[str, float] = field(default_factory=lambda: {"preemption": 0.0, "idle release": 0.0})
    lost: dict[str, float] = field(default_factory=lambda: {"preemption": 0.0, "idle release": 0.0})
    partial_lost: float = 0.0
    trace_lost: float = 0.0
    trace_preempted: int = 0
    light_waits: list[float] = field(default_factory=list)
    """Light users' cells: seconds from sending the cell to its start (0 on a warm pod)."""
    light_gpu_waits: list[float] = field(default_factory=list)
    """Light users' cells that had to get a pod: seconds from sending the cell to the pod's admission."""
    light_cells: int = 0
    heavy_waits: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    """The start estimate's absolute error over the actual wait, at arrival, per pod that waited."""
    waited: int = 0
    without: int = 0
    shots_rerun: int = 0
    shots_failed: int = 0
    shots_done: int = 0
    sessions_preempted: int = 0
    gave_up: int = 0
    """Sessions whose user gave up: a cell cut off by preemption :data:`session_users.GIVE_UP` times in a row."""
    releases: int = 0
    peak_held: int = 0


class Pool(ABC):
    """The replay: ``schedule`` admits; the ``on_*`` handlers are the users' and pods' events; sessions' own
    events are the subclass's (session_flow.Sessions)."""

    def __init__(self, gpus: int, rules: Rules, check: bool) -> None:
        self.gpus, self.free, self.rules, self.check = gpus, gpus, rules, check
        self.running: dict[int, Pod] = {}
        self.pending: list[tuple[tuple[int, float, int], Pod]] = []
        self.events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = 0
        self.admissions: list[float] = []
        self.asked: dict[int, tuple[float, float | None]] = {}
        self.tally = Tally()

    # --- events and pods ---

    def at(self, when: float, handler: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, handler, args))

    def run(self) -> None:
        while self.events:
            now, _, handler, args = heapq.heappop(self.events)
            handler(now, *args)
            self.schedule(now)

    def create(self, now: float, owner: Any, gpus: int, waits_at: str, protected_at: str = "", lowers_to: str = "",
               protection: float = 0.0) -> Pod:
        self.seq += 1
        pod = Pod(self.seq, owner, gpus, now, waits_at, protected_at or waits_at, lowers_to or waits_at, protection)
        bisect.insort(self.pending, ((-pod.priority(now), now, pod.id), pod))
        if not isinstance(owner, Trace):
            self.asked[pod.id] = (now, None)
        return pod

    def _admit(self, pod: Pod, now: float) -> None:
        self.free -= pod.gpus
        assert self.free >= 0, "a GPU double-booked"
        pod.admitted = now
        self.running[pod.id] = pod
        self.admissions.append(now)
        self.tally.peak_held = max(self.tally.peak_held, self.gpus - self.free)
        if self.check:
            assert sum(p.gpus for p in self.running.values()) == self.gpus - self.free, "GPUs held do not add up"
        asked = self.asked.pop(pod.id, None)
        if asked is not None and now > asked[0]:
            self.tally.waited += 1
            if asked[1] is None:
                self.tally.without += 1
            else:
                self.tally.errors.append(abs(asked[1] - (now - asked[0])) / (now - asked[0]))
        owner = pod.owner
        if isinstance(owner, Trace):
            self.at(now + owner.hold, self.on_trace_end, pod)
        elif isinstance(owner, Shot):
            owner.started = now
            self.at(now + owner.user.gpu_seconds, self.on_shot_end, pod)
        else:
            self.session_admitted(owner, now)

    def end(self, pod: Pod, now: float) -> float:
        """Free ``pod``'s GPUs; the GPU seconds it held."""
        assert pod.admitted is not None and self.running.pop(pod.id) is pod
        self.free += pod.gpus
        return pod.gpus * (now - pod.admitted)

    # --- admission, as the ClusterQueue does it ---

    def schedule(self, now: float) -> None:
        lowest = min((p.priority(now) for p in self.running.values()), default=None)
        i = 0
        while i < len(self.pending):
            (neg, _, _), pod = self.pending[i]
            victims = ([] if pod.gpus <= self.free else None if lowest is None or -neg <= lowest
                       else self._victims(pod, -neg, now))
            if victims is not None:
                del self.pending[i]  # first: a preempted trace pod or cell is queued again, into this list
                for victim in victims:
                    self.preempted(victim, now)
                self._admit(pod, now)
                lowest = min((p.priority(now) for p in self.running.values()), default=None)
                continue
            if self.free == 0 and (lowest is None or -neg <= lowest):
                break  # nothing behind it (a lower or equal class) can start or preempt
            i += 1
        for pod_id, (since, guess) in list(self.asked.items()):
            if guess is None and since == now:
                position = next(k for k, (_, p) in enumerate(self.pending) if p.id == pod_id)
                self.asked[pod_id] = (since, self.rules.estimate(position, self.admissions[-21:], now))

    def _victims(self, pod: Pod, priority: int, now: float) -> list[Pod] | None:
        """The running pods to preempt for ``pod``, lowest class and newest first; None when they are not enough."""
        victims = sorted((p for p in self.running.values() if p.priority(now) < priority),
                         key=lambda p: (p.priority(now), -(p.admitted or 0.0)))
        chosen, freed = [], self.free
        for victim in victims:
            if freed >= pod.gpus:
                break
            chosen.append(victim)
            freed += victim.gpus
        return chosen if freed >= pod.gpus else None

    def preempted(self, pod: Pod, now: float) -> None:
        held = self.end(pod, now)
        owner = pod.owner
        if isinstance(owner, Trace):
            self.tally.trace_lost += held
            self.tally.trace_preempted += 1
            self.create(now, Trace(owner.index, owner.hold, owner.priority), pod.gpus, owner.priority)
        elif isinstance(owner, Shot):
            self.tally.partial_lost += held
            ran = now - owner.started
            if self.rules.rerun(ran, ran >= owner.user.first_output, owner.user.rerun_asked, owner.rerun_before):
                owner.rerun_before = True
                self.tally.shots_rerun += 1
                self.create(now, owner, pod.gpus, "batch")
            else:
                owner.failed = True
                self.tally.shots_failed += 1
        else:
            self.tally.sessions_preempted += 1
            self.session_lost(owner, held, now)

    # --- trace pods and one-shot cells ---

    def on_trace_end(self, now: float, pod: Pod) -> None:
        if pod.id in self.running:
            self.end(pod, now)

    def on_trace_arrive(self, now: float, trace: Trace, gpus: int) -> None:
        self.create(now, trace, gpus, trace.priority)

    def on_shot(self, now: float, shot: Shot) -> None:
        self.create(now, shot, 1, "batch")

    def on_shot_end(self, now: float, pod: Pod) -> None:
        if pod.id in self.running:
            self.end(pod, now)
            pod.owner.done = True
            self.tally.shots_done += 1

    @abstractmethod
    def session_admitted(self, session: Session, now: float) -> None:
        """A session's pod was admitted."""

    @abstractmethod
    def session_lost(self, session: Session, held: float, now: float) -> None:
        """A session's pod was preempted (it held ``held`` GPU seconds)."""
