"""The notebook sessions of bench_sessions_replay.py: each user's cells, gaps, idle releases, preemptions and
resumes on the pool of session_pool.py, with the tree's decisions (session_rules.Rules).

Every GPU second a session's pods hold is booked once (:attr:`session_pool.Session.ledger`): running a cell
(done, run again after its results were lost, or cut off by a preemption), restoring a checkpoint, or idle.
Whenever a pod ends with the session's variables in it (preempted, released for idling), the GPU time of the
cells those variables hold is booked once more, as resumed (the tree checkpoints) or lost (it does not: the user
runs those cells again).
"""

from __future__ import annotations

from session_pool import RESTORE, Pod, Pool, Session
from session_users import GIVE_UP, LEFT_FOR


class Sessions(Pool):
    """The pool with the sessions' events."""

    def _open(self, s: Session, kind: str, now: float) -> None:
        s.segment = (kind, now)

    def _close(self, s: Session, now: float) -> tuple[str, float]:
        kind, since = s.segment
        s.segment = ("", now)
        if kind:
            s.ledger[kind] = s.ledger.get(kind, 0.0) + s.user.gpus * (now - since)
        return kind, now - since

    def on_submit(self, now: float, s: Session) -> None:
        """The user sends the session's next cell (or sends the cut-off one again)."""
        if s.over:
            return
        s.epoch += 1  # an idle release planned before is off
        s.submitted = now
        if s.released is not None:
            self.tally.returned += s.released[1] * (now - s.released[0])
            s.released = None
        if s.pod is None:
            waits, protected, lower, protection = self.rules.session_class(s.user.gpus, s.user.priority)
            s.pod = self.create(now, s, s.user.gpus, waits, protected, lower, protection)
        elif s.pod.admitted is not None:
            self._close(s, now)
            self.on_start(now, s, s.epoch)

    def session_admitted(self, s: Session, now: float) -> None:
        start = now
        if s.submitted is not None and s.user.light:
            self.tally.light_gpu_waits.append(now - s.submitted)
        if s.ended_by:
            cells = s.state_cells
            if self.rules.state_kept(s.user.gpus):
                self.tally.resumed[s.ended_by] += s.user.gpus * sum(cells)
                start = now + RESTORE
                self._open(s, "restore", now)
            else:
                self.tally.lost[s.ended_by] += s.user.gpus * sum(cells)
                s.redo = [*cells, *s.redo]
                s.state_cells = []
            s.ended_by = ""
        self.at(start, self.on_start, s, s.epoch)

    def on_start(self, now: float, s: Session, epoch: int) -> None:
        if epoch != s.epoch or s.pod is None:
            return
        self._close(s, now)
        again = bool(s.redo)
        if s.submitted is not None and not again:
            # the wait for the cell the user sent: for a GPU, then the restore or the cells run again first
            (self.tally.light_waits if s.user.light else self.tally.heavy_waits).append(now - s.submitted)
            s.submitted = None
        seconds = s.redo.pop(0) if again else s.user.cells[s.cell].gpu_seconds
        s.running = (now, seconds, again)
        self._open(s, "ran", now)
        self.at(now + seconds, self.on_cell_end, s, epoch)

    def on_cell_end(self, now: float, s: Session, epoch: int) -> None:
        if epoch != s.epoch or s.running is None:
            return
        _, seconds, again = s.running
        s.running = None
        self._close(s, now)
        s.state_cells.append(seconds)
        if again:
            s.ledger["redone"] = s.ledger.get("redone", 0.0) + s.user.gpus * seconds
            self.on_start(now, s, epoch)
            return
        s.ledger["done"] += s.user.gpus * seconds
        s.done_cells += 1
        s.cut = 0
        gap = s.user.cells[s.cell].gap
        s.cell += 1
        if s.user.light:
            self.tally.light_cells += 1
        if s.cell == len(s.user.cells) and s.user.closes:
            self._end_pod(s, now)
            s.over = True
            return
        self._open(s, "idle", now)
        timeout = self.rules.idle_timeout(f"s{s.user.index}", s.user.idle_ask)
        if 0 < timeout < gap:
            self.at(now + timeout, self.on_idle, s, epoch)
        if s.cell == len(s.user.cells):
            self.at(now + LEFT_FOR, self.on_leave, s)
        else:
            self.at(now + gap, self.on_submit, s)

    def _end_pod(self, s: Session, now: float) -> None:
        pod: Pod | None = s.pod
        s.pod = None
        if pod is not None and pod.admitted is not None:
            self._close(s, now)
            s.ledger["held"] += self.end(pod, now)

    def on_idle(self, now: float, s: Session, epoch: int) -> None:
        """The idle timer: the pod goes back to the pool (checkpointed first where the tree does that)."""
        if epoch != s.epoch or s.pod is None or s.pod.admitted is None or s.running is not None:
            return
        self._end_pod(s, now)
        s.released = (now, s.user.gpus)
        s.ended_by = "idle release"
        self.tally.releases += 1

    def on_leave(self, now: float, s: Session) -> None:
        """The user left without closing: their server is culled, the session ends."""
        s.over = True
        s.epoch += 1
        self._end_pod(s, now)
        if s.released is not None:
            self.tally.returned += s.released[1] * (now - s.released[0])
            s.released = None

    def session_lost(self, s: Session, held: float, now: float) -> None:
        kind, seconds = self._close(s, now)
        s.ledger["held"] += held
        s.pod = None
        s.epoch += 1
        s.ended_by = "preemption"
        waiting = kind in ("ran", "restore") or s.submitted is not None
        s.cut += waiting
        if waiting and s.cut >= GIVE_UP:
            s.over = s.gave_up = True
            self.tally.gave_up += 1
        if kind == "ran" and s.running is not None:
            s.ledger["partial lost"] += s.user.gpus * seconds
            self.tally.partial_lost += s.user.gpus * seconds
            _, cut, again = s.running
            s.running = None
            if again:
                s.redo.insert(0, cut)
            self.on_submit(now, s)  # the user sends the cut-off cell again (unless they gave up)
        elif kind == "restore" or s.submitted is not None:
            self.on_submit(now, s)
