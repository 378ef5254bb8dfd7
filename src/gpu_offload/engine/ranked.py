"""The ranks of a distributed run (``--nodes``) followed as one run.

A backend's distributed run yields the events of every rank, each carrying its rank. :class:`RankedRun`
turns them into what a single run would send, so the engine follows it unchanged: output of every rank
(prefixed with the rank, grouped per rank at the end, or rank 0 only), variables from the ``out_rank``
only, one ``done`` when every rank is done. The first rank that fails ends the run at once: its error is
the run's, naming the rank, and the other ranks are interrupted (a rank blocked in a collective ignores
that; the engine's release kills it after the grace period). A rendezvous that does not complete in
time ends the run naming the ranks that never started.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ..runner import frames
from .backends.base import Placed, Queued, Ranks, Relaunched, Run, RunEvent, RunnerExit

LIVE = "live"
"""Every rank's lines as they arrive, each prefixed with ``[rank R]``."""
GROUPED = "grouped"
"""Every rank's output held until the run ends, then shown rank by rank (``--group-output``)."""
RANK0 = "rank0"
"""Rank 0's output only (``--quiet-ranks``)."""
SHOW_MODES = (LIVE, GROUPED, RANK0)
WAKE = 0.25
"""Longest wait on the backend between rendezvous checks."""


def prefix_lines(text: str, prefix: str, at_line_start: bool) -> tuple[str, bool]:
    """``text`` with ``prefix`` at the start of each of its lines (a chunk may end mid-line: the next chunk
    continues that line); returns the text and whether the next chunk starts a line."""
    if not text:
        return text, at_line_start
    lines = text.split("\n")
    out = [(prefix if at_line_start and lines[0] else "") + lines[0]]
    out.extend(prefix + line if line else line for line in lines[1:])
    return "\n".join(out), text.endswith("\n")


def describe_ranks(ranks: list[int], shape: Ranks) -> str:
    """``ranks 2, 3 (node 1)``: ranks and the nodes they belong to."""
    nodes = sorted({rank // shape.procs_per_node for rank in ranks})
    word = "rank" if len(ranks) == 1 else "ranks"
    where = "node" if len(nodes) == 1 else "nodes"
    return f"{word} {', '.join(map(str, ranks))} ({where} {', '.join(map(str, nodes))})"


class RankedRun:
    """A backend's distributed run (events of many ranks) as one run for the engine."""

    def __init__(self, inner: Run, shape: Ranks, show: str = LIVE, *, settle: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``settle``: a session's run waits this long after the first failure for the other ranks to stop,
        then kills the session (ranks stuck in a collective would take the next cell's commands never);
        ``None``: the run ends at the first failure and the engine's release kills what still runs."""
        if show not in SHOW_MODES:
            raise ValueError(f"show={show!r}: one of {', '.join(SHOW_MODES)}")
        self._inner = inner
        self._shape = shape
        self._show = show
        self._clock = clock
        self._arrived: set[int] = set()
        self._first_arrival: float | None = None
        self._done: dict[int, str] = {}
        self._ready: deque[RunEvent] = deque()
        self._held: dict[int, list[frames.Stream | frames.DisplayData]] = {}
        self._line_start: dict[tuple[int, str], bool] = {}
        self._finished = False
        self._interrupted = False
        self._settle = settle
        self._failure: frames.Error | None = None
        self._settle_by: float | None = None

    # -- what the engine sees -------------------------------------------------------------------------

    @property
    def cluster(self) -> str:
        return self._inner.cluster

    def progress(self) -> str:
        return self._inner.progress()

    def next_event(self, timeout: float) -> RunEvent | None:
        """The next event of the run as one; see :meth:`gpu_offload.engine.backends.base.Run.next_event`."""
        deadline = self._clock() + timeout
        while not self._ready:
            if self._finished:
                return None
            self._check_rendezvous()
            self._check_settled()
            remaining = deadline - self._clock()
            if self._ready:
                break
            event = self._inner.next_event(max(0.0, min(remaining, WAKE)))
            if event is not None:
                self._take(event)
            elif remaining <= 0:
                return None
        return self._ready.popleft()

    def interrupt(self) -> None:
        """Interrupt every rank (Ctrl-C); the run ends ``interrupted`` once each has stopped."""
        self._interrupted = True
        self._inner.interrupt()

    def kill(self) -> None:
        self._inner.kill()

    def release(self, grace: float) -> int | None:
        """Every rank gets ``grace`` seconds to end, then is killed (a rank stuck in a collective)."""
        return self._inner.release(grace)

    # -- turning rank events into the run's -----------------------------------------------------------

    def _take(self, event: RunEvent) -> None:
        if isinstance(event, (Placed, frames.Metrics, Queued)):  # a queued Job's place in line is the run's
            self._ready.append(event)
        elif isinstance(event, RunnerExit):
            self._all_exited(event)
        elif isinstance(event, frames.Hello):
            self._arrive(event)
        elif isinstance(event, (frames.Stream, frames.DisplayData)):
            self._output(event)
        elif isinstance(event, (frames.Status, frames.Stopping)):  # one notice for the run, not one per rank
            if event.rank == self._shape.out_rank:
                self._ready.append(event)
        elif isinstance(event, frames.RunnerWarning):
            self._ready.append(frames.RunnerWarning(event.seq, f"rank {event.rank}: {event.text}",
                                                    rank=event.rank))
        elif isinstance(event, Relaunched):
            self._relaunched(event)
        elif isinstance(event, frames.FrameError):
            self._ready.append(frames.FrameError(event.seq, f"rank {event.rank}: {event.reason}", event.line,
                                                 rank=event.rank))
        elif isinstance(event, frames.Outputs):
            if event.rank == self._shape.out_rank:  # another rank's references are never acted on
                self._ready.append(event)
        elif isinstance(event, frames.Error):
            self._error(event)
        elif isinstance(event, frames.Done):
            self._rank_done(event)

    def _relaunched(self, event: Relaunched) -> None:
        """The backend launched every rank again: the rendezvous clock starts anew with the first rank to
        start now (no rank had shown anything, so nothing else of the first launch counts)."""
        self._arrived.clear()
        self._first_arrival = None
        self._ready.append(event)

    def _arrive(self, hello: frames.Hello) -> None:
        if not self._arrived:
            self._first_arrival = self._clock()
            self._ready.append(hello)  # the engine shows who runs the cells: the first rank stands for all
        self._arrived.add(hello.rank)

    def _check_rendezvous(self) -> None:
        if self._first_arrival is None or len(self._arrived) >= self._shape.world_size:
            return
        limit = self._shape.rendezvous_timeout
        if self._clock() - self._first_arrival <= limit:
            return
        missing = [rank for rank in range(self._shape.world_size) if rank not in self._arrived]
        self._fail(frames.Error(-1, "RendezvousTimeout", (
            f"{describe_ranks(missing, self._shape)} never started within --rendezvous-timeout {limit:g} s "
            f"of the first rank; the {len(self._arrived)} rank(s) that did were stopped. Output so far is kept, "
            "no variable was copied back. Check why those nodes could not start, or raise --rendezvous-timeout."
        ), (), rank=missing[0]))

    def _output(self, event: frames.Stream | frames.DisplayData) -> None:
        rank = event.rank
        if self._show == RANK0:
            if rank == 0:
                self._ready.append(event)
        elif self._show == GROUPED:
            self._held.setdefault(rank, []).append(event)
        elif isinstance(event, frames.Stream):
            key = (rank, event.name)
            text, self._line_start[key] = prefix_lines(event.text, f"[rank {rank}] ",
                                                       self._line_start.get(key, True))
            self._ready.append(frames.Stream(event.seq, event.name, text, rank=rank))
        else:
            self._ready.append(event)

    def _error(self, error: frames.Error) -> None:
        if (self._interrupted or self._failure is not None) and error.ename == "KeyboardInterrupt":
            return  # the interrupt this run was asked for, or sent after the first failure
        self._fail(error)

    def _rank_done(self, done: frames.Done) -> None:
        self._done[done.rank] = done.status
        if self._failure is not None:
            if len(self._done) == self._shape.world_size:
                self._finish(frames.Done(-1, "error", 0.0), self._failure)
        elif done.status == "error":
            self._fail(frames.Error(-1, "RankFailed", f"rank {done.rank} ended with an error it did not describe",
                                    (), rank=done.rank))
        elif done.status == "interrupted" and not self._interrupted:
            self._fail(frames.Error(-1, "KeyboardInterrupt",
                                    f"rank {done.rank} was interrupted from outside the notebook", (), rank=done.rank))
        elif len(self._done) == self._shape.world_size:
            self._finish(frames.Done(-1, "interrupted" if self._interrupted else "ok", 0.0))

    def _all_exited(self, exit_: RunnerExit) -> None:
        missing = [rank for rank in range(self._shape.world_size) if rank not in self._done]
        if missing and not self._interrupted:
            self._fail(frames.Error(-1, "RankDied", (
                f"{describe_ranks(missing, self._shape)} ended before finishing the cell (exit code "
                f"{exit_.code}). {exit_.detail}".strip()), (), rank=missing[0]))
            if self._failure is not None and not self._finished:
                # the backend's run is over (a session's pod ended: lost with its node, deleted, OOMKilled): no
                # rank can still stop, nor be stuck waiting for a peer, so the session is ended now, not after
                # the settle time with words about ranks blocked in a collective
                self._inner.kill()
                self._finish(frames.Done(-1, "error", 0.0), self._failure)
            return
        self._flush_held()
        self._ready.append(exit_)
        self._finished = True

    def _fail(self, error: frames.Error) -> None:
        """The first failure ends the run: its error, naming the rank, then ``done``; the others stop."""
        if self._finished or self._failure is not None:
            return
        rank = error.rank
        header = f"rank {rank} of {self._shape.world_size} (node {rank // self._shape.procs_per_node}) failed:\n"
        # a SystemExit's value is the script's exit status (the runner protocol): kept as it is
        evalue = error.evalue if error.ename == "SystemExit" else f"{error.evalue} [rank {rank}]"
        failure = frames.Error(error.seq, error.ename, evalue, (header, *error.traceback), rank=rank)
        self._inner.interrupt()
        if self._settle is None or len(self._done) == self._shape.world_size:
            self._finish(frames.Done(-1, "error", 0.0), failure)
        else:
            self._failure = failure
            self._settle_by = self._clock() + self._settle

    def _check_settled(self) -> None:
        """A session's ranks that did not stop after the first failure: the session is killed."""
        if self._failure is None or self._settle_by is None or self._finished or self._clock() <= self._settle_by:
            return
        stuck = [rank for rank in range(self._shape.world_size) if rank not in self._done]
        self._inner.kill()
        self._ready.append(frames.RunnerWarning(-1, (
            f"{describe_ranks(stuck, self._shape)} did not stop within {self._settle:g} s after rank "
            f"{self._failure.rank} failed (blocked in a collective, waiting for it): the session was closed, "
            "and its state is gone; the next cell starts it anew")))
        self._finish(frames.Done(-1, "error", 0.0), self._failure)

    def _finish(self, done: frames.Done, error: frames.Error | None = None) -> None:
        self._flush_held()
        if error is not None:
            self._ready.append(error)
        self._ready.append(done)
        self._finished = True

    def _flush_held(self) -> None:
        for rank in sorted(self._held):
            self._ready.append(frames.Stream(-1, "stdout", f"[rank {rank}]\n", rank=rank))
            self._ready.extend(self._held[rank])
        self._held.clear()
