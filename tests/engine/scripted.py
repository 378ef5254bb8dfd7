"""A backend whose runs play a script of runner events, for tests of what the engine does with them (no
runner process is started): a run may hold after its script until it is interrupted, as a cell in
``time.sleep`` does, or ignore the interrupt, as a cell stuck in C code does."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from gpu_offload.engine.backends.base import Job, RunEvent, RunnerExit, SessionInfo, Transfer
from gpu_offload.runner.frames import Done, Hello, Stream


@dataclass
class ScriptedRun:
    """Plays ``script``; then, if ``hold``, waits for :meth:`interrupt` (``deaf``: waits for :meth:`kill`)."""

    script: list[RunEvent]
    hold: bool = False
    deaf: bool = False
    cluster: str = "local"
    interrupted: int = 0
    killed: bool = False
    released: bool = False
    reads_after_interrupt: int = 0
    _queue: deque[RunEvent] = field(default_factory=deque)
    _wake: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._queue.extend(self.script)
        if not self.hold:
            self._queue.extend([Done(len(self.script), "ok", 0.1), RunnerExit(0)])

    def progress(self) -> str:
        return ""

    def next_event(self, timeout: float) -> RunEvent | None:
        if self.interrupted:
            self.reads_after_interrupt += 1
        if self._queue:
            return self._queue.popleft()
        self._wake.wait(timeout)
        self._wake.clear()
        return self._queue.popleft() if self._queue else None

    def interrupt(self) -> None:
        self.interrupted += 1
        if self.hold and not self.deaf:
            # what a runner does with SIGINT: the cell's KeyboardInterrupt, its last line, then done
            self._queue.extend([Stream(90, "stdout", "stopping\n"), Done(91, "interrupted", 1.0), RunnerExit(0)])
        self._wake.set()

    def kill(self) -> None:
        self.killed = True
        self._queue.append(RunnerExit(-9))
        self._wake.set()

    def release(self, grace: float) -> int | None:
        self.released = True
        return 0


def started_line(text: str) -> list[RunEvent]:
    """A runner's first frames: hello, then one line of the cell."""
    return [Hello(0, "3.11.7", 7, (), False), Stream(1, "stdout", text)]


@dataclass
class ScriptedBackend:
    """Submits every job as the next run of ``runs`` (a test makes the runs it then watches)."""

    runs: list[ScriptedRun]
    name: str = "local"
    submitted: list[Job] = field(default_factory=list)

    def transfer(self, run_id: str) -> Transfer:
        return Transfer(input_transport="inline", output_transport="inline")

    def describe(self) -> str:
        return "scripted backend"

    def inventory(self) -> None:
        return None

    def user_runs(self) -> None:
        return None

    def trusts(self, cluster: str) -> bool:
        return True

    def submit(self, job: Job) -> ScriptedRun:
        self.submitted.append(job)
        return self.runs[len(self.submitted) - 1]

    def sessions(self) -> list[SessionInfo]:
        return []

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        return False

    def close(self) -> None:
        pass


def wait_for(check: object, what: str, timeout: float = 30.0) -> None:
    """Poll ``check()`` until it holds (a deadline for a hang, not a speed goal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
