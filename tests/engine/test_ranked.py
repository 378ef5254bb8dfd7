"""Many ranks followed as one run: a rendezvous that does not complete names the ranks that never started.

The ranks here are frames of the real wire format, decoded by the real decoder, from a scripted run; the
clock is the test's, so no test waits for a timeout to pass.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable

from gpu_offload.engine.backends.base import Placed, Ranks, Relaunched, RunEvent, RunnerExit
from gpu_offload.engine.engine import TRUSTED, FollowSettings, follow
from gpu_offload.engine.errors import RemoteError
from gpu_offload.engine.ranked import RankedRun, prefix_lines
from gpu_offload.engine.sinks import RecordingSink
from gpu_offload.runner.frames import Error, FrameDecoder
from gpu_offload.runner.wire import MARK

NONCE = "0123456789abcdef" * 2


def frame(seq: int, rank: int, kind: str, **payload: object) -> str:
    run = "-" if kind == "hello" else "run1"
    return f"{MARK} {NONCE} {seq} {run} {rank} {kind} {json.dumps(payload)}\n"


class ScriptedRun:
    """A run whose ranks' frames are given in advance; each step of the clock releases the next one."""

    cluster = "local"

    def __init__(self, lines: list[str], world: int, tick: Callable[[], None]) -> None:
        decoder = FrameDecoder(NONCE, run_id="run1", ranks=world)
        self._events: deque[RunEvent] = deque(e for line in lines for e in decoder.feed(line))
        self._tick = tick
        self.interrupted = 0
        self.killed = 0

    def progress(self) -> str:
        return ""

    @property
    def events(self) -> tuple[RunEvent, ...]:
        return tuple(self._events)

    def add(self, *events: RunEvent) -> None:
        """Events the backend itself adds after the scripted frames (where a pod ran, a relaunch, the exit)."""
        self._events.extend(events)

    def next_event(self, timeout: float) -> RunEvent | None:
        self._tick()
        return self._events.popleft() if self._events else None

    def interrupt(self) -> None:
        self.interrupted += 1

    def kill(self) -> None:
        self.killed += 1

    def release(self, grace: float) -> int | None:
        return None


def test_a_rendezvous_that_does_not_complete_names_the_ranks_that_never_started() -> None:
    now = [0.0]

    def tick() -> None:
        now[0] += 10.0

    lines = [frame(0, 0, "hello", python="3.11.7", pid=1, gpus=[], session=False),
             frame(1, 1, "hello", python="3.11.7", pid=2, gpus=[], session=False),
             frame(2, 1, "stream", name="stdout", text="waiting at the rendezvous\n")]
    inner = ScriptedRun(lines, 4, tick)
    run = RankedRun(inner, Ranks(2, 2, rendezvous_timeout=60), clock=lambda: now[0])
    sink = RecordingSink()
    outcome = follow(run, sink, FollowSettings(progress_after=1e9), TRUSTED)
    assert outcome.status == "error"
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "RendezvousTimeout"
    assert "ranks 2, 3 (node 1) never started within --rendezvous-timeout 60 s" in outcome.error.evalue
    assert inner.interrupted  # the ranks that did start are stopped
    shown = "".join(args[1] for method, args in sink.calls if method == "stream")
    assert "[rank 1] waiting at the rendezvous" in shown


def test_a_run_launched_again_elsewhere_starts_its_rendezvous_clock_anew() -> None:
    # the first launch's ranks 0 and 1 started at t=10 and 20; the backend launched the run again at t=70; all
    # four ranks start from t=80 on: 70 s after the first launch's first rank, within 60 s of the new one's
    now = [0.0]

    def tick() -> None:
        now[0] += 10.0

    def hello(seq: int, rank: int) -> str:
        return frame(seq, rank, "hello", python="3.11.7", pid=rank + 1, gpus=[], session=False)

    inner = ScriptedRun([hello(0, 0), hello(1, 1)], 4, tick)
    inner.add(*(Placed(f"running in pod p-0 on virtual node east-gpu ({i})") for i in range(4)))
    inner.add(Relaunched("node 1: east cannot schedule the pod; retrying the run once on west"))
    again = ScriptedRun([hello(2 + rank, rank) for rank in range(4)]
                        + [frame(6 + rank, rank, "done", status="ok", elapsed=0.1) for rank in range(4)], 4, tick)
    inner.add(*again.events, RunnerExit(0, ""))
    run = RankedRun(inner, Ranks(2, 2, rendezvous_timeout=60), clock=lambda: now[0])
    sink = RecordingSink()
    outcome = follow(run, sink, FollowSettings(progress_after=1e9), TRUSTED)
    assert outcome.status == "ok", outcome.error
    notices = [args[0] for method, args in sink.calls if method == "notice"]
    assert "warning: node 1: east cannot schedule the pod; retrying the run once on west" in notices


def test_every_line_of_a_chunk_is_prefixed_and_a_partial_line_continues() -> None:
    text, start = prefix_lines("a\nb", "[rank 1] ", True)
    assert (text, start) == ("[rank 1] a\n[rank 1] b", False)
    text, start = prefix_lines("c\n", "[rank 1] ", start)
    assert (text, start) == ("c\n", True)


def test_a_session_whose_ranks_cannot_stop_after_a_failure_is_closed_saying_why() -> None:
    now = [0.0]

    def tick() -> None:
        now[0] += 1.0

    hellos = [frame(i, rank, "hello", python="3.11.7", pid=rank, gpus=[], session=True) for i, rank in enumerate(range(4))]
    failing = [frame(4, 2, "error", ename="ValueError", evalue="bad", traceback=["line 3\n"]),
               frame(5, 2, "done", status="error", elapsed=0.1),
               frame(6, 0, "error", ename="KeyboardInterrupt", evalue="interrupted", traceback=[]),
               frame(7, 0, "done", status="interrupted", elapsed=0.1)]  # ranks 1 and 3 stay in a collective
    inner = ScriptedRun(hellos + failing, 4, tick)
    run = RankedRun(inner, Ranks(2, 2), settle=5.0, clock=lambda: now[0])
    sink = RecordingSink()
    outcome = follow(run, sink, FollowSettings(progress_after=1e9), TRUSTED)
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "ValueError"
    assert "[rank 2]" in outcome.error.evalue
    assert inner.interrupted and inner.killed
    notices = " ".join(args[0] for method, args in sink.calls if method == "notice")
    assert "ranks 1, 3 (nodes 0, 1) did not stop within 5 s after rank 2 failed" in notices
    assert "the session was closed" in notices


def test_a_session_whose_run_ended_with_a_pod_is_closed_at_once_without_ranks_said_to_be_stuck() -> None:
    """A session's pod lost with its node mid-cell: the backend ends the run (the pod's error, then the exit); no
    rank is left to stop, so there is no settle wait and no word of ranks blocked in a collective."""
    now = [0.0]

    def tick() -> None:
        now[0] += 1.0

    hellos = [frame(i, rank, "hello", python="3.11.7", pid=rank, gpus=[], session=True) for i, rank in enumerate(range(2))]
    inner = ScriptedRun(hellos + [frame(2, 1, "stream", name="stdout", text="changing\n")], 2, tick)
    lost = "node 0: the virtual node of east was lost (east-gpu stopped answering and Kubernetes evicted the pod)"
    inner.add(Error(-1, "DeletionByTaintManager", lost, (), rank=0), RunnerExit(None, ""))
    run = RankedRun(inner, Ranks(2, 1), settle=60.0, clock=lambda: now[0])
    sink = RecordingSink()
    outcome = follow(run, sink, FollowSettings(progress_after=1e9), TRUSTED)
    assert isinstance(outcome.error, RemoteError) and outcome.error.evalue == f"{lost} [rank 0]"
    assert inner.killed == 1 and now[0] < 60.0  # ended at once, not after the settle time
    notices = " ".join(args[0] for method, args in sink.calls if method == "notice")
    assert "did not stop" not in notices and "collective" not in notices, notices
