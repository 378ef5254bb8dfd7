"""``--session NAME --nodes N`` on kubernetes: a warm distributed session in the pods of one Indexed Job.

Each pod runs the runner with ``--session`` as its node's launcher (docs/distributed.md, the node launcher
interface, point 4). The kernel attaches to every pod's stdin as it does to a single session pod
(:class:`~.host.Attachment`), greets each with the session's nonce and shape, and sends every cell's
``run`` (and Ctrl-C's ``interrupt``) to all of them; each launcher passes it on to its ranks, which keep their
namespaces (and their process group) between cells. The pods' frames come through
:class:`~.jobrun.JobPods`, and the engine's :class:`~...ranked.RankedRun` merges them as for a one-shot
distributed run, closing the session (:meth:`RankSessionRun.kill`) when ranks do not stop after a failure.
Closing deletes the Job with ``propagationPolicy: Background``, which takes its pods, Secret and Service.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ....liqo_peering.errors import APIError
from ....liqo_peering.labels import QUEUE_NAME_LABEL
from ....runner.frames import Done, Error, Outputs, RunnerWarning
from ....runner.secrecy import greeting
from ..base import Ranks, RunEvent, RunnerExit, RunRequest, SessionInfo, stale_frames_note
from .explain import FAILED
from .follow import PodEnded, PodFollower
from .host import Attachment, Host, WarmSession, failure_events
from .jobrun import JobPods, kueue_stop, pod_failure
from .plan import PodOrder
from .session import SessionCell

SESSION_GONE = (". The session's state is gone with it: its Job was deleted, so Kueue does not start it again "
                "unattended, and the next cell of this session starts it anew")
SEND_WAIT = 0.25
"""Longest wait for frames between looks at whether every pod runs, before a cell's command is sent."""


class KubeRankSession(WarmSession):
    """A distributed session: an Indexed Job of session launchers and an attach connection to each pod."""

    def __init__(self, name: str, host: Host, placement: RunRequest, replaces: str = "",
                 ended: str = "ended while idle") -> None:
        super().__init__(name, host, replaces, ended)
        assert placement.ranks is not None
        self.ranks: Ranks = placement.ranks
        self.request = placement
        nonce = secrets.token_hex(16)
        order = self.order = PodOrder(f"s{secrets.token_hex(7)}", nonce, placement, session=True,
                                      defaults=host.run_defaults())
        self.job = host.launch(order)
        self._ending = threading.Lock()
        self.nodes = JobPods(self.pods, order, self.ranks, self.job, host.watch_seconds, on_end=self._pod_ended)
        self._greeting = greeting(nonce, self.ranks.bundle_field())
        """Every launcher's first line: the nonce and the shape (its group rank is its pod's index)."""
        self._stdin: dict[int, Attachment] = {}
        self.closed_how = ""
        """How the session was closed during a cell (its ranks did not stop), for the next cell's note."""

    @property
    def holder(self) -> str:
        """What holds the session, as messages name it."""
        return f"Job {self.job.name}"

    @property
    def cluster(self) -> str:
        return self.job.ctx.cluster

    def followers(self) -> Iterable[PodFollower]:
        return self.nodes.followers.values()

    def end_words(self) -> str:
        """Lost with its node (a closing during the cell that followed is that loss's doing, not ranks that did not
        stop), else closed during a cell (its ranks did not stop), else how the Job's first pod to end did."""
        lost = [f.end for f in self.nodes.followers.values() if f.end is not None and f.end.lost and f.end.summary]
        if lost:
            return f"was {lost[0].summary} " + ("during a cell" if self.closed_how else "while idle")
        return self.closed_how or super().end_words()

    def info(self) -> SessionInfo:
        """The line ``%gpu_offload sessions`` shows."""
        where = f"Job {self.job.name} ({self.ranks.nodes} pods) on {self.cluster}"
        return SessionInfo(self.name, where, self.runs, self.busy)

    def submit(self, bundle: bytes, run_id: str) -> RankSessionRun:
        """Queue one bundle for every node; it is sent once every pod's launcher runs."""
        run = RankSessionRun(self, self.take_cell(bundle), run_id)
        if self.runs > 1:
            run.announce(f"in the {self.ranks.nodes} pods of Job {self.job.name} on {self.cluster}, session {self.name}")
        note = self.replaced_note()
        if note is not None:
            run.warn(note)
        return run

    def send(self, command: dict[str, Any]) -> int | None:
        """Write ``command`` to every node's launcher, node 0 first; the node it could not reach, else None."""
        return self.send_each({index: command for index in self.nodes.followers})

    def send_each(self, commands: Mapping[int, dict[str, Any]]) -> int | None:
        """Write each node's own command to its launcher (a checkpoint's URLs differ per rank), node 0 first; the
        node it could not reach, else None."""
        for index in sorted(commands):
            stdin = self._stdin.get(index)
            if stdin is None:
                stdin = self._stdin[index] = Attachment(self.pods, self.nodes.followers[index].name, self._greeting)
            if not stdin.send(commands[index]):
                return index
        return None

    def _pod_ended(self, follower: PodFollower) -> None:
        """A pod of the session ended while no cell runs (a cell's own end is its own to say): the session is over
        (its ranks lost a peer). Kueue, which preempts a Job by suspending it, would admit the Job again once GPUs
        free and start its launchers with nobody attached, holding every GPU of the session until the idle
        timeout: the Job is deleted now, and the next cell (and the status) says how the session ended."""
        if self.busy or self.dead or not self._ending.acquire(blocking=False):
            return  # a second pod's end, or a cell follows the pods itself
        try:
            stopped = kueue_stop(self.pods, self.job, self.nodes.followers.values(), self.ranks.nodes)
            if stopped is not None and stopped.summary:
                self.closed_how = (f"was {stopped.summary} while idle (its Job was deleted, so Kueue does not start "
                                   "it again unattended)")
            with contextlib.suppress(APIError):  # gone already
                self.pods.delete_job(self.job.name, grace=0)
        except Exception:  # noqa: BLE001 - a follower's thread must end; the next cell closes the session anyway
            pass

    def close(self, grace: float) -> None:
        """Ask every launcher to end its ranks' sessions, then delete the Job (its pods, Secret and Service go
        with it). The launchers told ``exit`` get up to ``grace`` seconds to end their ranks first: a rank that
        read its ``exit`` writes no checkpoint at the SIGTERM of the Job's deletion (one that had not yet would
        write its record into storage this kernel may already have emptied)."""
        told = not self.dead and any(stdin.attached for stdin in self._stdin.values())
        self.hang_up(self._stdin.values())
        deadline = time.monotonic() + max(0.0, grace)
        while told and time.monotonic() < deadline and not all(f.ended for f in self.nodes.followers.values()):
            time.sleep(0.05)
        self.nodes.stop()
        with contextlib.suppress(APIError):  # gone already; what is left, the kernel's cleanup finds by label
            self.pods.delete_job(self.job.name, grace=max(0, int(grace)))


class RankSessionRun(SessionCell[KubeRankSession]):
    """One cell in a distributed session: the events of every rank (``RankedRun`` ends it when each rank is
    done); the pods stay."""

    def __init__(self, session: KubeRankSession, command: dict[str, Any], run_id: str) -> None:
        super().__init__(session, command, run_id)
        self._warned = False
        self._interrupting = False
        """This kernel interrupted the cell (Ctrl-C): an interrupted rank is no news from outside."""
        self._asked_why = False
        """Whether the Job's events were read for a stop from outside (once a cell)."""

    @property
    def cluster(self) -> str:
        return self.session.cluster

    def progress(self) -> str:
        """Phase and elapsed time, for ``--noblock`` handles."""
        phase = "Pending" if self._command is not None else "Running"
        return (f"{phase} in session {self.session.name} ({self.session.holder} on {self.cluster}), "
                f"{time.monotonic() - self._since:.0f} s")

    def _foreign(self) -> int:
        return sum(f.foreign for f in self.session.nodes.followers.values())

    def _send(self) -> RunEvent | None:
        """Send the cell to every node once every pod's launcher runs; an event if a node cannot be reached."""
        session = self.session
        if self._command is None or session.dead or not session.nodes.all_running:
            return None
        command, self._command = self._command, None
        # whatever an earlier cell that was not followed to its end still sends is not this cell's
        self._dropped += sum(f.expect_run(self._run_id) for f in session.nodes.followers.values())
        self._foreign_before = self._foreign()
        lost = session.send(command)
        if lost is None:
            return None
        session.dead = True
        rank = lost * session.ranks.procs_per_node
        pod = session.nodes.followers[lost].name
        self._backlog.end(RunnerExit(None, f"could not attach to pod {pod}"))
        return Error(-1, "SessionLost", f"node {lost}: could not attach to pod {pod} of session {session.name}; "
                                        "the session was closed, run the cell again to start it anew", (), rank=rank)

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.engine.backends.base.Run.next_event`; until the cell is sent, ``None`` comes
        after ``SEND_WAIT`` at the latest (the caller asks again, and the cell goes out once every pod runs)."""
        if self._backlog.due:
            return self._backlog.take()
        if self._command is not None:
            restored = self._restoring(self.session.nodes.all_running)
            if restored is not None:
                return restored
        failed = self._send()
        if failed is not None:
            return failed
        got = self.session.nodes.next(min(timeout, SEND_WAIT) if self._command is not None else timeout)
        if got is None:
            return None
        index, item = got
        if self._from_outside(item) and self._kueue_stopped():
            return self._backlog.take()
        if isinstance(item, PodEnded):
            return self._pod_ended(index, item)
        if isinstance(item, Outputs):
            item = self.session.host.fetched(self._run_id, item, self.cluster)
        elif isinstance(item, Done) and not self._warned:
            self._warned = True
            dropped = self._dropped + self._foreign() - self._foreign_before
            if dropped:
                self._backlog.add(item)
                return RunnerWarning(-1, stale_frames_note(self.session.name, dropped))
        return item

    def _from_outside(self, item: object) -> bool:
        """A rank interrupted, or a pod that ended, while this kernel stopped nothing, in a Job Kueue manages: asked
        about once a cell."""
        labels = (self.session.job.owner.get("metadata") or {}).get("labels") or {}
        if self._interrupting or self._asked_why or QUEUE_NAME_LABEL not in labels:
            return False
        return ((isinstance(item, Error) and item.ename == "KeyboardInterrupt")
                or (isinstance(item, Done) and item.status == "interrupted") or isinstance(item, PodEnded))

    def _kueue_stopped(self) -> bool:
        """Whether Kueue stopped the session's Job during the cell: then the cell ends saying so, the session is
        over and its Job deleted (Kueue only suspended it, and would start its launchers again unattended)."""
        self._asked_why = True
        session = self.session
        state = kueue_stop(session.pods, session.job, session.nodes.followers.values(), session.ranks.nodes)
        if state is None:
            return False
        session.dead = True
        session.closed_how = f"was {state.summary} during a cell"
        diagnostics = "\n".join(d for f in session.nodes.followers.values() for d in f.diagnostics)
        text = state.text + (SESSION_GONE if not session.resumes_from else (
            f". Its Job was deleted, so Kueue does not start it again unattended; session {session.name}'s next cell "
            f"resumes it from checkpoint {session.resumes_from}, written before this cell: what this cell changed "
            "is lost"))
        self._backlog.end(*[dataclasses.replace(e, rank=0) if isinstance(e, Error) else e
                            for e in failure_events(dataclasses.replace(state, text=text), None, diagnostics)])
        session.nodes.stop()
        with contextlib.suppress(APIError):  # gone already
            session.pods.delete_job(session.job.name, grace=0)
        return True

    def _pod_ended(self, index: int, ended: PodEnded) -> RunEvent | None:
        """A pod of the session ended during the cell: the session is over (its ranks lost a peer)."""
        self.session.dead = True
        diagnostics = "\n".join(self.session.nodes.followers[index].diagnostics)
        if ended.state.kind == FAILED:
            self._backlog.end(*pod_failure(index, ended, diagnostics, self.session.ranks))
        else:
            self._backlog.end(RunnerExit(ended.state.exit_code, diagnostics))
        return self._backlog.take()

    def interrupt(self) -> None:
        """Interrupt the cell in every rank, not the session (a cell not sent yet is simply not sent)."""
        if self._command is not None:
            self._command = None
            self._keep_restore()
            self._backlog.end(*(Done(-1, "interrupted", 0.0, rank=rank)
                                for rank in range(self.session.ranks.world_size)))
            return
        self._interrupting = True
        self.session.send({"op": "interrupt"})

    def kill(self) -> None:
        """End the session (every rank's state is lost): ranks that cannot stop would never take the next cell."""
        self._interrupting = True
        # a session Kueue preempted keeps that as how it ended: its ranks were gone, not stuck
        self.session.closed_how = (self.session.closed_how
                                   or "was closed when its ranks did not stop after a failed or interrupted cell")
        self.session.close(grace=0)
