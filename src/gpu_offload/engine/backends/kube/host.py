"""What every run and session of the kube backend shares, and its one way back to the backend: what the launcher
created (:class:`Launched`) and the pod followed (:class:`LaunchedPod`), the :class:`Host` interface the
backend implements, a pod's place in Kueue's line, the stdin of a session's runner and the warm session the
backend keeps, and the :class:`Backlog` of events each run decided ahead (``run``, ``jobrun``, ``session`` and
``rank_session`` build on these)."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ....liqo_peering.wording import duration
from ....runner.frames import Error, Outputs
from ...timing import Phase
from ..base import Queued, RunEvent, RunnerExit
from .drain import DrainStep
from .explain import PodContext, PodState
from .follow import PodFollower
from .plan import PodOrder
from .pods import PodApi
from .protection import Protection
from .queueing import Ticket

if TYPE_CHECKING:
    from ....liqo_peering.settings import RunDefaults


WHY_STOPPED_SECONDS = 10.0
"""How long to wait for a pod's status, or a Job's events, to say why its runners were stopped from outside."""


@dataclass(frozen=True)
class Launched:
    """A runner pod or a distributed run's Indexed Job the launcher created, and where it was sent."""

    name: str
    owner: Mapping[str, Any]
    """The Pod or Job as the server stored it."""
    ctx: PodContext
    """Where the pods were sent; a Job's ``ctx.cluster`` names every cluster they may run on (``a or b`` with
    ``--spread``); a queued pod's cluster is known once Kueue admits it."""
    clusters: tuple[str, ...] = ()
    """The cluster ids the pods may run on (one without ``--spread``)."""
    outputs_from: str = ""
    """The cluster whose trust decides what comes back: the one cluster, or the first untrusted of several
    (the out rank may land on any of them)."""
    stdin: bytes = b""
    """What each runner reads on stdin once it runs (the bundle; empty for a session, or when the pods fetch
    it from object storage)."""
    phases: tuple[Phase, ...] = ()
    """When placement and the creation ended (``time.monotonic()``), for the run's timing."""
    ticket: Ticket | None = None
    """A queued pod's place in Kueue's line."""
    protection: Protection | None = None
    """A session pod protected from preemption for its first minutes (lowered to its own class after)."""


@dataclass
class LaunchedPod:
    """A runner pod being followed (and its place in Kueue's line while queued)."""

    name: str
    follower: PodFollower
    ticket: Ticket | None = None
    phases: tuple[Phase, ...] = ()
    protection: Protection | None = None

    @property
    def ctx(self) -> PodContext:
        """Where the pod was sent: the follower's (a queued pod's cluster is known once Kueue admits it)."""
        return self.follower.ctx


class Host(Protocol):
    """What a run or session of the kube backend asks of the backend and tells it: the one way back to it."""

    pods: PodApi
    watch_seconds: int
    """Server timeout of one watch request of the pods followed."""

    def launch(self, order: PodOrder, avoid: frozenset[str] = frozenset()) -> Launched:
        """Create ``order``'s pod, or its Job when it has ranks (on none of the ``avoid`` cluster ids); raises
        when nothing fits, or, for a retry, when the cell is pinned with ``--cluster`` or queueing is on."""
        ...

    def leave(self, ticket: Ticket) -> None:
        """Stop following a queued pod's place in line (admitted, withdrawn or released)."""
        ...

    def fetched(self, run_id: str, outputs: Outputs, cluster: str) -> Outputs:
        """``outputs`` of run ``run_id`` from ``cluster`` with what it stored read back (as its trust allows)."""
        ...

    def released(self, run_id: str) -> None:
        """Run ``run_id`` is over and let go: what it stored goes."""
        ...

    def idle(self, session: WarmSession) -> None:
        """A cell of ``session`` ended and the session waits for the next one."""
        ...

    def run_defaults(self) -> RunDefaults:
        """What a run or session starting now gets where it does not say, resolved once for it."""
        ...

    def cordoned(self, node: str, order: PodOrder) -> DrainStep | None:
        """What ``order``'s pod waiting on ``node`` (its runner not started) does when ``node`` is cordoned
        (``drain.waiting_step``, placed as its launch is), from the kernel's inventory; None when it is not, or the
        inventory cannot tell."""
        ...


def follow_pod(host: Host, launched: Launched, order: PodOrder) -> LaunchedPod:
    """Start following the runner pod ``launched`` made for ``order``."""
    follower = PodFollower(host.pods, launched.owner, order.nonce, launched.ctx, one_shot=not order.session,
                           watch_seconds=host.watch_seconds, run_id=order.bundle_run, stdin=launched.stdin or None)
    return LaunchedPod(launched.name, follower, launched.ticket, launched.phases, launched.protection)


QUEUED_AFTER = 2.0
"""Seconds a gated pod waits before the user is told it is queued even if Kueue has not listed it yet."""


class InLine:
    """What a run says about its pod's place in Kueue's line: the place when it changed, then that it left the
    line. Said only once the pod is listed as pending or has waited a moment, so a pod admitted at once never
    says it was queued."""

    def __init__(self) -> None:
        self.shown = -1
        """The version of the ticket last shown (-1: the run was not shown as queued)."""

    def event(self, launched: LaunchedPod, host: Host) -> Queued | None:
        ticket, gated = launched.ticket, launched.follower.gated
        if ticket is not None and not gated:
            self.leave(launched, host)
        return self.said(ticket, gated)

    def said(self, ticket: Ticket | None, gated: bool) -> Queued | None:
        """What to say of ``ticket`` now; ``gated``: Kueue still holds the run back. Once it does not, the caller
        stops following the ticket."""
        if ticket is None:
            return None
        if not gated:
            if self.shown >= 0:
                self.shown = -1
                return Queued(f"admitted by Kueue after {duration(time.monotonic() - ticket.since)} in line",
                              waiting=False)
            return None
        due = ticket.position is not None or time.monotonic() - ticket.since > QUEUED_AFTER
        if due and ticket.version != self.shown:
            self.shown = ticket.version
            return Queued(ticket.text())
        return None

    @staticmethod
    def leave(launched: LaunchedPod, host: Host) -> None:
        """Stop following the pod's place in line (admitted, withdrawn or released)."""
        ticket, launched.ticket = launched.ticket, None
        if ticket is not None:
            host.leave(ticket)


DRAIN_CHECK_EVERY = 2.0
"""How often a run whose pod waits on a node asks whether that node was cordoned (a read of the kernel's cache)."""


class Cordon:
    """Whether a pod that waits on its node before its runner started should leave it (its donor is being
    drained): asked every :data:`DRAIN_CHECK_EVERY` seconds while it waits, once it is bound and out of any
    queue; a pod that must stay there is told so once."""

    def __init__(self) -> None:
        self._next = 0.0
        self.said = False

    def step(self, launched: LaunchedPod, order: PodOrder, host: Host) -> DrainStep | None:
        follower = launched.follower
        now = time.monotonic()
        if (self.said or now < self._next or not follower.node or follower.gated or follower.started.is_set()):
            return None
        self._next = now + DRAIN_CHECK_EVERY
        step = host.cordoned(follower.node, order)
        if step is not None and not step.move:
            self.said = True
        return step


class Backlog:
    """The events a run decided ahead of its pods' next ones (the pod's phases, a failure told in two events, the
    end of a cell interrupted before it was sent), and whether the run is over once they are taken. Every run
    keeps one, and its ``next_event`` answers from it first (:attr:`due`)."""

    def __init__(self, events: Iterable[RunEvent] = ()) -> None:
        self._events: deque[RunEvent] = deque(events)
        self.over = False
        """Nothing follows the held events: the run ended (failed, lost, finished or withdrawn)."""

    @property
    def due(self) -> bool:
        """``next_event`` answers with :meth:`take`: an event is held, or the run is over (then ``None``)."""
        return bool(self._events) or self.over

    def take(self) -> RunEvent | None:
        """The first held event, or None."""
        return self._events.popleft() if self._events else None

    def add(self, *events: RunEvent) -> None:
        """Hold ``events`` for the next calls of ``next_event``, after those held already."""
        self._events.extend(events)

    def end(self, *events: RunEvent) -> None:
        """The run is over after ``events``: hold them, and nothing after them."""
        self.over = True
        self._events.extend(events)


def failure_events(state: PodState, code: int | None, diagnostics: str) -> list[RunEvent]:
    """The events that end a run whose pod failed: an ``Error`` the engine raises, then the exit."""
    return [Error(-1, state.reason or "PodFailed", state.text, ()), RunnerExit(code, diagnostics)]


class Attachment:
    """The stdin of one session pod's runner, through an attach websocket held for the session's life; the
    runner's greeting (its frame nonce, and for a distributed session's launcher the shape) goes first."""

    def __init__(self, pods: PodApi, pod: str, first: bytes) -> None:
        self._pods = pods
        self.pod = pod
        self._first: bytes | None = first
        """The runner's first line on stdin (its frame nonce: never in the pod's environment or Secret)."""
        self._ws: Any = None

    @property
    def attached(self) -> bool:
        """Whether the runner has been written to (one never attached to waits for no ``exit``)."""
        return self._ws is not None

    def send(self, command: dict[str, Any]) -> bool:
        """Write one command line (attaching first if needed); False if that failed twice."""
        line = json.dumps(command) + "\n"
        for _attempt in range(2):
            try:
                if self._ws is None or not self._ws.is_open():
                    self._ws = self._pods.attach(self.pod)
                if self._first is not None:
                    self._ws.write_stdin(self._first.decode("ascii"))
                    self._first = None
                self._ws.write_stdin(line)
                return True
            except Exception:  # noqa: BLE001 - a dropped websocket: attach again once
                self._ws = None
        return False

    def close(self) -> None:
        """Close the websocket (the runner's stdin stays open: ending it is the pod's deletion's job)."""
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):  # already closed
                ws.close()


class WarmSession:
    """What the backend keeps of a warm session, whatever holds it (one pod, or a distributed session's Job):
    whether a cell runs, how many ran, and the idle timer."""

    def __init__(self, name: str, host: Host, replaces: str, ended: str) -> None:
        self.name = name
        self.host = host
        self.pods = host.pods
        self.replaces = replaces
        """What held the session of this name that ended while idle (``pod NAME``): the first cell says its
        state is gone."""
        self.ended = ended
        """How that ended, in a few words ("preempted after 14 min by a higher-priority run")."""
        self.runs = 0
        self.busy = False
        self.dead = False
        self.idle_timer: Any = None
        """The backend's timer that ends the session if it stays idle too long (cancelled by the next cell)."""
        self.release_at: float | None = None
        """When that timer ends the session (wall clock), while it runs."""
        self.resumes_from = ""
        """The checkpoint a next session of this name is restored from, once one was written."""
        self.claims = 0
        """Cells the backend handed this session to (under its lock): an idle timer set before the last one is
        stale."""
        self.unrestored: Any = None
        """The restore a cell interrupted before its pod ran left undone (``resume.PendingRestore``): the next
        cell does it."""

    def followers(self) -> Iterable[PodFollower]:
        """The followers of the session's pods: one, or one per node of a distributed session."""
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        """Whether the session may still take cells: not closed, and none of its pods ended (one may end while
        idle: lost node, eviction, cleanup; one ended breaks a distributed session's process group for all)."""
        return not self.dead and not any(f.ended for f in self.followers())

    def end_words(self) -> str:
        """How the session ended while idle, for the next session of this name: how the first of its pods to
        end did (Kueue's preemption in its words)."""
        for follower in self.followers():
            end = follower.end
            if end is not None and end.summary:
                return f"was {end.summary} while idle"
        return "ended while idle"

    def take_cell(self, bundle: bytes) -> dict[str, Any]:
        """Mark the session busy with one more cell; the ``run`` command that carries ``bundle``."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.release_at = None
        if self.busy:
            from ...errors import OffloadUsageError

            raise OffloadUsageError(
                f"Session `{self.name}` is still running a cell. Wait for it (`%gpu_result`), cancel it, or use "
                "another --session name.")
        self.busy = True
        self.runs += 1
        return {"op": "run", "bundle_b64": base64.b64encode(bundle).decode("ascii")}

    def replaced_note(self) -> str | None:
        """Said once, by the first cell of a session that replaces one that ended while idle."""
        if not self.replaces:
            return None
        note = (f"session {self.name}: its {self.replaces} {self.ended}, so this cell starts the session anew and "
                "the variables of the old one are gone; run the cells that define them again")
        self.replaces = ""
        return note

    def hang_up(self, stdins: Iterable[Attachment]) -> None:
        """The first step of closing: no idle timer any more, every runner written to is asked to exit (a dead
        session's are not), and the connections close; deleting what holds the session is the caller's."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        for stdin in stdins:
            if not self.dead and stdin.attached:
                stdin.send({"op": "exit"})
            stdin.close()
        self.dead = True

    def went_idle(self, alive: bool) -> None:
        """A cell ended: the session waits for the next one (the backend's idle timer starts)."""
        self.busy = False
        if alive:
            self.host.idle(self)
