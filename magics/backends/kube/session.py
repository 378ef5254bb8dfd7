"""``--session`` on kubernetes: a warm pod per session that receives cell after cell through ``attach``.

The pod runs the runner in session mode (``stdin: true``, no service-account token); commands go in
through an attach websocket held for the session's life, frames come out through one log follow that
resumes after drops. Ctrl-C sends the runner an ``interrupt`` command: the cell stops, the session and its
variables stay.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...runner.frames import Done, Hello, Outputs, RunnerWarning
from ...runner.secrecy import greeting
from ..base import Placed, RunEvent, RunnerExit, RunRequest, SessionInfo, stale_frames_note
from .explain import FAILED, PREEMPTED
from .follow import PodEnded
from .run import InLine, LaunchedPod, Launcher, PodOrder, failure_events


class KubeSession:
    """One warm runner pod and the attach connection to its stdin."""

    def __init__(self, name: str, launcher: Launcher, placement: RunRequest, replaces: str = "",
                 ended: str = "ended while idle") -> None:
        self.name = name
        self.replaces = replaces
        """The pod of a session of this name that ended while idle: the first cell says its state is gone."""
        self.ended = ended
        """How that pod ended, in a few words ("preempted after 14 min by a higher-priority run")."""
        self._launcher = launcher
        self.pods = launcher.pods
        nonce = secrets.token_hex(16)
        self.order = PodOrder(f"s{secrets.token_hex(7)}", nonce, placement, session=True)
        self.launched: LaunchedPod = launcher.launch(self.order)
        self._greeting: bytes | None = greeting(nonce)
        """The runner's first line on stdin (its frame nonce: never in the pod's environment or Secret)."""
        self.moved = False
        self.runs = 0
        self.busy = False
        self.dead = False
        self.hello = False
        self.on_idle: Callable[[KubeSession], None] | None = None
        """Called each time a cell of the session ends and the session waits, idle, for the next one."""
        self.idle_timer: Any = None
        """The backend's timer that ends the session if it stays idle too long (cancelled by the next cell)."""
        self.claims = 0
        """Cells the backend handed this session to (under its lock): an idle timer set before the last one is
        stale."""
        self._ws: Any = None

    @property
    def alive(self) -> bool:
        """Whether the pod may still take cells (it may have ended while idle: lost node, eviction, cleanup)."""
        return not self.dead and not self.launched.follower.ended

    def info(self) -> SessionInfo:
        """The line ``%gpu_offload sessions`` shows."""
        where = f"pod {self.launched.name} on {self.launched.ctx.cluster}"
        return SessionInfo(self.name, where, self.runs, self.busy)

    def submit(self, bundle: bytes, run_id: str, cleanup: Callable[[], None] | None = None,
               fetch: Callable[[Outputs], Outputs] | None = None) -> SessionRun:
        """Queue one bundle; it is sent once the runner container runs."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        if self.busy:
            from ...errors import OffloadUsageError

            raise OffloadUsageError(
                f"Session `{self.name}` is still running a cell. Wait for it (`%gpu_result`), cancel it, or use "
                "another --session name.")
        self.busy = True
        self.runs += 1
        command = {"op": "run", "bundle_b64": base64.b64encode(bundle).decode("ascii")}
        run = SessionRun(self, command, run_id, cleanup, fetch)
        if self.runs > 1 and self.launched.follower.placed:
            # the pod's follower said where it runs under the session's first cell; each later cell says it too
            run.announce(f"{self.launched.follower.placed}, session {self.name}")
        if self.replaces:
            run.warn(f"session {self.name}: its pod {self.replaces} {self.ended}, so this cell starts a new "
                     "session pod and the variables of the old one are gone; run the cells that define them again")
            self.replaces = ""
        return run

    def end_words(self) -> str:
        """How the pod ended while idle, for the next session of this name: Kueue's preemption in its words."""
        end = self.launched.follower.end
        return f"was {end.summary} while idle" if end is not None and end.summary else "ended while idle"

    def send(self, command: dict[str, Any]) -> bool:
        """Write one command to the runner's stdin (attaching first if needed); False if that failed."""
        line = json.dumps(command) + "\n"
        for _attempt in range(2):
            try:
                if self._ws is None or not self._ws.is_open():
                    self._ws = self.pods.attach(self.launched.name)
                if self._greeting is not None:
                    self._ws.write_stdin(self._greeting.decode("ascii"))
                    self._greeting = None
                self._ws.write_stdin(line)
                return True
            except Exception:  # noqa: BLE001 - a dropped websocket: attach again once
                self._ws = None
        return False

    def move(self) -> None:
        """Start the session's pod again on another cluster (the first one was lost or could not schedule it
        before the runner started, so no state is lost); raises when nothing else fits or it is pinned."""
        first = self.launched
        self.moved = True
        first.follower.stop()
        self._ws = None
        self.pods.delete_pod(first.name, grace=0)
        retry = dataclasses.replace(self.order, run_id=f"{self.order.run_id}r")
        self.launched = self._launcher.launch(retry, frozenset({first.ctx.cluster}))
        self._greeting = greeting(self.order.nonce)  # a new runner reads its nonce again

    def close(self, grace: float) -> None:
        """Ask the runner to exit, then delete the pod (its Secret goes with it)."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        if not self.dead and self._ws is not None:
            self.send({"op": "exit"})
        self.dead = True
        self.launched.follower.stop()
        if self._ws is not None:
            with contextlib.suppress(Exception):  # already closed
                self._ws.close()
        self.pods.delete_pod(self.launched.name, grace=max(0, int(grace)))
        InLine.leave(self.launched, self._launcher)


class SessionRun:
    """One cell in a session: ends with the ``done`` frame; the pod stays."""

    def __init__(self, session: KubeSession, command: dict[str, Any], run_id: str,
                 cleanup: Callable[[], None] | None = None, fetch: Callable[[Outputs], Outputs] | None = None) -> None:
        self.session = session
        self._run_id = run_id
        self._dropped = 0
        """Items of earlier runs dropped for this one; the follower counts frames dropped after sending."""
        self._foreign_before = 0
        self._cleanup = cleanup
        self._fetch = fetch
        self._command: dict[str, Any] | None = command
        self._sent = command
        """Kept to send again if the pod has to move before its runner started."""
        self._pending: deque[RunEvent] = deque()
        self._since = time.monotonic()
        self._line = InLine()

    def announce(self, text: str) -> None:
        """Show where the cell runs before its own events."""
        self._pending.append(Placed(text))

    def warn(self, text: str) -> None:
        """Show ``text`` as a warning before the cell's own events."""
        self._pending.append(RunnerWarning(-1, text))

    @property
    def cluster(self) -> str:
        """The cluster of the session's pod."""
        return self.session.launched.ctx.cluster

    def route_cancel(self, cancel: Callable[[], None]) -> None:
        """A backend's run gets no cancel requests from outside the engine."""

    def progress(self) -> str:
        """Phase, cluster and elapsed time, for ``--noblock`` handles."""
        where = f"session {self.session.name} on {self.session.launched.ctx.cluster}"
        phase = "Pending" if self._command is not None else "Running"
        return f"{phase} in {where}, {time.monotonic() - self._since:.0f} s"

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.magics.backends.base.Run.next_event`."""
        if self._pending:
            return self._pending.popleft()
        follower = self.session.launched.follower
        queued = self._line.event(self.session.launched, self.session._launcher)
        if queued is not None:
            return queued
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
            if state.reason == PREEMPTED:
                state = dataclasses.replace(state, text=(
                    f"{state.text}. Session {self.session.name}'s state is gone with its pod: the next cell starts a "
                    "new session, so run the cells that define its variables again"))
            if state.kind == FAILED:
                self._pending.extend(failure_events(state, state.exit_code, diagnostics))
            else:
                self._pending.append(RunnerExit(state.exit_code, diagnostics))
            return self._pending.popleft()
        if isinstance(item, Hello):
            self.session.hello = True
        elif isinstance(item, Outputs) and self._fetch is not None:
            item = self._fetch(item)
        elif isinstance(item, Done):
            dropped = self._dropped + follower.foreign - self._foreign_before
            if dropped:
                self._pending.append(item)
                return RunnerWarning(-1, stale_frames_note(self.session.name, dropped))
        return item

    def interrupt(self) -> None:
        """Interrupt the cell, not the session (a cell not sent yet is simply not sent)."""
        if self._command is not None:
            self._command = None
            self._pending.append(Done(-1, "interrupted", 0.0))
            return
        self.session.send({"op": "interrupt"})

    def kill(self) -> None:
        """End the session (its state is lost)."""
        self.session.close(grace=0)

    def release(self, grace: float) -> int | None:
        """Mark the session idle; its pod stays up."""
        self.session.busy = False
        if self._cleanup is not None:
            self._cleanup()
        if self.session.on_idle is not None and self.session.alive:
            self.session.on_idle(self.session)
        return None
