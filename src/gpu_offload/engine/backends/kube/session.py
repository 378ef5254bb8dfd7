"""``--session`` on kubernetes: a warm pod per session that receives cell after cell through ``attach``.

The pod runs the runner in session mode (``stdin: true``, no service-account token); commands go in
through an attach websocket held for the session's life, frames come out through one log follow that
resumes after drops. Ctrl-C sends the runner an ``interrupt`` command: the cell stops, the session and its
variables stay.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from typing import Any, Generic, TypeVar

from ....liqo_peering import labels as L
from ....liqo_peering.errors import GpuOffloadError
from ....liqo_peering.wording import duration
from ....runner.frames import Done, Hello, Outputs, RunnerWarning
from ....runner.secrecy import greeting
from ..base import Placed, RunEvent, RunnerExit, RunRequest, SessionInfo, stale_frames_note
from .explain import FAILED, PREEMPTED
from .follow import PodEnded, PodFollower
from .host import Attachment, Backlog, Host, InLine, LaunchedPod, WarmSession, failure_events, follow_pod
from .plan import PodOrder
from .pods import PodApi


class Protector:
    """Raises a protected session pod (``.protection``) to the protected class once its runner runs and lowers it
    to its own class again after its protection time, so Kueue may preempt it from then on (it waited in line at
    its own class: see ``protection``); what the next cell is told of it."""

    def __init__(self, name: str, pods: PodApi, launched: LaunchedPod) -> None:
        self.protection = launched.protection
        self.until: float | None = None
        """When the protection ends (wall clock), once the pod runs at the protected class."""
        self.note: tuple[str, bool] | None = None
        """Said once at the session's next cell: (text, whether it is a warning)."""
        self._stop = threading.Event()
        if self.protection is not None:
            threading.Thread(target=self._run, args=(name, pods, launched), daemon=True,
                             name=f"gpu-offload-protect-{name}").start()

    def _run(self, name: str, pods: PodApi, launched: LaunchedPod) -> None:
        protection, follower = self.protection, launched.follower
        assert protection is not None
        while not follower.running.wait(1.0):  # counted from the runner's start, not from the queue
            if self._stop.is_set() or follower.ended:
                return
        if self._stop.is_set() or not self._relabel(name, pods, launched.name, protection.protected, "raised"):
            return
        self.until = time.time() + protection.seconds
        if self._stop.wait(protection.seconds):
            return
        self.until = None
        if self._relabel(name, pods, launched.name, protection.own, "lowered"):
            self.note = (f"session {name}'s protection from preemption ended after "
                         f"{duration(protection.seconds, 'min')}: "
                         f"its pod now runs at priority class {protection.own}, so Kueue may preempt it for a "
                         "higher-priority run", False)

    def _relabel(self, name: str, pods: PodApi, pod: str, to: str, how: str) -> bool:
        """Set the pod's priority class; False (with a note when the API refused) if it could not."""
        protection = self.protection
        assert protection is not None
        try:
            return pods.relabel_pod(pod, {L.PRIORITY_CLASS_LABEL: to})
        except GpuOffloadError as exc:
            if how == "raised":
                self.note = (f"session {name} is not protected from preemption: its pod could not be raised from "
                             f"priority class {protection.own} to {protection.protected} ({exc}); Kueue may preempt "
                             f"it as any run of class {protection.own}", True)
            else:
                self.note = (f"session {name}: its pod could not be lowered from priority class "
                             f"{protection.protected} to {protection.own} after its protection time ({exc}); it "
                             "stays protected", True)
            return False

    def words(self, now: float) -> str:
        """``protected from preemption until ...`` while it is, for ``%gpu_offload sessions``."""
        if self.protection is None or self.until is None or self._stop.is_set():
            return ""
        at = time.strftime("%H:%M:%S UTC", time.gmtime(self.until))
        return (f"protected from preemption until {at} (in {duration(max(0.0, self.until - now), 'min')}; priority class "
                f"{self.protection.protected}, then {self.protection.own})")

    def stop(self) -> None:
        self._stop.set()


class KubeSession(WarmSession):
    """One warm runner pod and the attach connection to its stdin."""

    def __init__(self, name: str, host: Host, placement: RunRequest, replaces: str = "",
                 ended: str = "ended while idle") -> None:
        super().__init__(name, host, replaces, ended)
        nonce = secrets.token_hex(16)
        self.order = PodOrder(f"s{secrets.token_hex(7)}", nonce, placement, session=True,
                              defaults=host.run_defaults())
        self.launched: LaunchedPod = follow_pod(host, host.launch(self.order), self.order)
        self.stdin = Attachment(self.pods, self.launched.name, greeting(nonce))
        self.protector = Protector(name, self.pods, self.launched)
        self.moved = False
        self.hello = False

    @property
    def request(self) -> RunRequest:
        """What the session's pod was started with."""
        return self.order.placement

    @property
    def holder(self) -> str:
        """What holds the session, as messages name it."""
        return f"pod {self.launched.name}"

    @property
    def cluster(self) -> str:
        return self.launched.ctx.cluster

    def followers(self) -> tuple[PodFollower]:
        return (self.launched.follower,)

    def info(self) -> SessionInfo:
        """The line ``%gpu_offload sessions`` shows."""
        where = f"pod {self.launched.name} on {self.launched.ctx.cluster}"
        return SessionInfo(self.name, where, self.runs, self.busy)

    def submit(self, bundle: bytes, run_id: str) -> SessionRun:
        """Queue one bundle; it is sent once the runner container runs."""
        run = SessionRun(self, self.take_cell(bundle), run_id)
        if self.runs > 1 and self.launched.follower.placed:
            # the pod's follower said where it runs under the session's first cell; each later cell says it too
            run.announce(f"{self.launched.follower.placed}, session {self.name}")
        note = self.replaced_note()
        if note is not None:
            run.warn(note)
        told, self.protector.note = self.protector.note, None
        if told is not None:
            (run.warn if told[1] else run.announce)(told[0])
        return run

    def send(self, command: dict[str, Any]) -> bool:
        """Write one command to the runner's stdin (attaching first if needed); False if that failed."""
        return self.stdin.send(command)

    def move(self) -> None:
        """Start the session's pod again on another cluster (the first one was lost or could not schedule it
        before the runner started, so no state is lost); raises when nothing else fits or it is pinned."""
        first = self.launched
        self.moved = True
        first.follower.stop()
        self.stdin.close()
        self.pods.delete_pod(first.name, grace=0)
        retry = dataclasses.replace(self.order, run_id=f"{self.order.run_id}r")
        self.launched = follow_pod(self.host, self.host.launch(retry, frozenset({first.ctx.cluster})), retry)
        self.stdin = Attachment(self.pods, self.launched.name, greeting(self.order.nonce))  # a new runner
        self.protector.stop()
        self.protector = Protector(self.name, self.pods, self.launched)

    def close(self, grace: float) -> None:
        """Ask the runner to exit, then delete the pod (its Secret goes with it)."""
        self.hang_up([self.stdin])
        self.protector.stop()
        self.launched.follower.stop()
        self.pods.delete_pod(self.launched.name, grace=max(0, int(grace)))
        InLine.leave(self.launched, self.host)


S = TypeVar("S", bound=WarmSession)


class SessionCell(Generic[S]):
    """What every cell of a warm session has alike: notes shown before its own events, and the session going
    idle when the cell is released."""

    def __init__(self, session: S, command: dict[str, Any], run_id: str) -> None:
        self.session = session
        self._run_id = run_id
        self._command: dict[str, Any] | None = command
        """The cell's ``run`` command until it is sent."""
        self._dropped = 0
        """Items of earlier runs dropped for this one; the follower counts frames dropped after sending."""
        self._foreign_before = 0
        self._backlog = Backlog()
        self._since = time.monotonic()
        self._restore: Any = None
        """The session's checkpoint to restore before the cell is sent (``resume.PendingRestore``), until done."""

    def announce(self, text: str) -> None:
        """Show where the cell runs before its own events."""
        self._backlog.add(Placed(text))

    def warn(self, text: str) -> None:
        """Show ``text`` as a warning before the cell's own events."""
        self._backlog.add(RunnerWarning(-1, text))

    def restore_first(self, pending: Any) -> None:
        """Restore ``pending`` (a ``resume.PendingRestore``) once the session's pods run, before the cell is sent;
        what it restores and how long that should take is said now, before any wait."""
        self._restore = pending
        self._backlog.add(Placed(pending.announce()))

    def _restoring(self, ready: bool) -> RunEvent | None:
        """Once ``ready`` (the pods run), do the pending restore and say how it went; None when none is due."""
        if self._restore is None or not ready or self.session.dead:
            return None
        pending, self._restore = self._restore, None
        self._backlog.add(RunnerWarning(-1, pending.run()))
        return self._backlog.take()

    def _keep_restore(self) -> None:
        """The cell is interrupted before it was sent: a restore not done yet is left to the next cell."""
        if self._restore is not None:
            self.session.unrestored, self._restore = self._restore, None

    def release(self, grace: float) -> int | None:
        """Mark the session idle; what holds it stays up."""
        self.session.host.released(self._run_id)
        self.session.went_idle(self.session.alive)
        return None


class SessionRun(SessionCell[KubeSession]):
    """One cell in a session: ends with the ``done`` frame; the pod stays."""

    def __init__(self, session: KubeSession, command: dict[str, Any], run_id: str) -> None:
        super().__init__(session, command, run_id)
        self._sent = command
        """Kept to send again if the pod has to move before its runner started."""
        self._line = InLine()

    @property
    def cluster(self) -> str:
        """The cluster of the session's pod."""
        return self.session.launched.ctx.cluster

    def progress(self) -> str:
        """Phase, cluster and elapsed time, for ``--noblock`` handles."""
        where = f"session {self.session.name} on {self.session.launched.ctx.cluster}"
        phase = "Pending" if self._command is not None else "Running"
        return f"{phase} in {where}, {time.monotonic() - self._since:.0f} s"

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.engine.backends.base.Run.next_event`."""
        if self._backlog.due:
            return self._backlog.take()
        follower = self.session.launched.follower
        queued = self._line.event(self.session.launched, self.session.host)
        if queued is not None:
            return queued
        if self._command is not None:
            restored = self._restoring(follower.started.is_set() and follower.running.is_set())
            if restored is not None:
                return restored
        # a pod that ended without running (unschedulable, deleted) is not attached to: its PodEnded is read
        # below and may move the session
        if (self._command is not None and follower.started.is_set() and follower.running.is_set()
                and not self.session.dead):
            command, self._command = self._command, None
            # whatever an earlier run that was not followed to its end still sends is not this run's
            self._dropped += follower.expect_run(self._run_id)
            self._foreign_before = follower.foreign
            if not self.session.send(command):
                self.session.dead = True
                return RunnerExit(None, f"could not attach to session pod {self.session.launched.name}")
        item = follower.next(timeout)
        if isinstance(item, PodEnded):
            state = item.state
            if state.kind == FAILED and state.elsewhere and not self.session.hello and not self.session.moved:
                try:
                    self.session.move()
                except Exception as exc:  # noqa: BLE001 - nothing else fits: report the first failure and why
                    state = dataclasses.replace(
                        state, text=f"{state.text}, before the session started; no other cluster can take it: {exc}")
                else:
                    self._command = self._sent
                    return RunnerWarning(-1, f"{state.elsewhere} before the session started; retrying once on "
                                             f"{self.session.launched.ctx.cluster}")
            self.session.dead = True
            diagnostics = "\n".join(follower.diagnostics)
            if state.reason == PREEMPTED and self.session.resumes_from:
                state = dataclasses.replace(state, text=(
                    f"{state.text}. Session {self.session.name}'s next cell resumes it from checkpoint "
                    f"{self.session.resumes_from}, written before this cell: what this cell changed is lost"))
            elif state.reason == PREEMPTED:
                state = dataclasses.replace(state, text=(
                    f"{state.text}. Session {self.session.name}'s state is gone with its pod: the next cell starts a "
                    "new session, so run the cells that define its variables again"))
            if state.kind == FAILED:
                self._backlog.add(*failure_events(state, state.exit_code, diagnostics))
            else:
                self._backlog.add(RunnerExit(state.exit_code, diagnostics))
            return self._backlog.take()
        if isinstance(item, Hello):
            self.session.hello = True
        elif isinstance(item, Outputs):
            item = self.session.host.fetched(self._run_id, item, self.cluster)
        elif isinstance(item, Done):
            dropped = self._dropped + follower.foreign - self._foreign_before
            if dropped:
                self._backlog.add(item)
                return RunnerWarning(-1, stale_frames_note(self.session.name, dropped))
        return item

    def interrupt(self) -> None:
        """Interrupt the cell, not the session (a cell not sent yet is simply not sent)."""
        if self._command is not None:
            self._command = None
            self._keep_restore()
            self._backlog.add(Done(-1, "interrupted", 0.0))
            return
        self.session.send({"op": "interrupt"})

    def kill(self) -> None:
        """End the session (its state is lost)."""
        self.session.close(grace=0)
