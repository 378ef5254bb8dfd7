"""One runner subprocess of the local backend: its environment, its frames read from the pipe, its signals.

Each runner starts in its own session (``start_new_session=True``): Jupyter's interrupt signals the
kernel's whole process group, and a runner must receive an interrupt only from the engine, which then
signals the runner's own group.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import IO

from ...runner.frames import FrameDecoder, Hello, Noise
from .base import RunEvent, RunnerExit, RunRequest

DIAGNOSTIC_LINES = 30


def visible_devices(gpus: int, inherited: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a runner given ``--gpus``: the first ``gpus`` of the kernel's own."""
    if inherited is not None and inherited.strip():
        pool = [d.strip() for d in inherited.split(",") if d.strip()]
    else:
        pool = [str(i) for i in range(max(gpus, 0))]
    return ",".join(pool[:gpus])


def runner_environment(placement: RunRequest, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a runner: the kernel's, plus the placement's, with the GPUs narrowed."""
    env = dict(base)
    # ipykernel points MPLBACKEND at its inline backend, which only works inside a kernel: without it the
    # runner picks its own backend that sends figures back as PNG
    if "inline" in env.get("MPLBACKEND", ""):
        del env["MPLBACKEND"]
    env.update(placement.env)
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(placement.gpus, base.get("CUDA_VISIBLE_DEVICES"))
    # modules next to the notebook import on the runner as they do in the kernel
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), base.get("PYTHONPATH", "")) if p)
    return env


class RunnerProcess:
    """One runner subprocess; its frames are read straight from the pipe by whoever follows the run.

    Reading in the following thread (rather than a reader thread feeding a queue) saves a thread
    hand-off per batch of frames, which is most of the engine's share of a warm cell's overhead.
    """

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        nonce: str,
        first_input: bytes,
        *,
        interactive: bool,
        run_id: str | None = None,
        ranks: int = 1,
    ) -> None:
        """Start ``argv``; ``first_input`` goes to its stdin first (a session's greeting, a one-shot's bundle).

        A one-shot runner gets its stdin closed after the bundle; an interactive (session) runner's stays
        open for its commands. Neither the nonce nor the bundle is ever in the environment or a named file.
        ``ranks``: the ranks whose frames the process may send (a node launcher of a distributed run).
        """
        self.diagnostics: deque[str] = deque(maxlen=DIAGNOSTIC_LINES)
        self._decoder = FrameDecoder(nonce, run_id=run_id, ranks=ranks)
        self._pending: deque[RunEvent] = deque()
        self._ended = False
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env),
        )
        self.pid = self.popen.pid
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._stdout = self.popen.stdout.fileno()
        # stderr is drained all the time, so a chatty runner can never block on a full pipe
        self._stderr = daemon_thread(self._read_diagnostics, self.popen.stderr)
        if interactive:
            self.send_bytes(first_input)
        else:  # a bundle may be larger than the pipe holds: written beside the reading of frames
            daemon_thread(self._write_and_close, first_input)

    def next_event(self, timeout: float) -> RunEvent | None:
        """The next frame (or the exit) within ``timeout`` seconds, else ``None``."""
        deadline = time.monotonic() + timeout
        while not self._pending:
            if self._ended:
                return None
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self._stdout], [], [], max(remaining, 0.0))
            # exited with nothing left to read: ended (a subprocess of the cell may hold the pipe open)
            self.pump(bool(readable))
            if not readable and not self._ended and remaining <= 0:
                return None
        return self._pending.popleft()

    def take(self) -> RunEvent | None:
        """An event already read, or ``None`` (for a reader that selects over several runners)."""
        return self._pending.popleft() if self._pending else None

    @property
    def ended(self) -> bool:
        """Whether the runner's exit has been read (its :class:`RunnerExit` is queued)."""
        return self._ended

    def fileno(self) -> int:
        """The runner's stdout, for ``select``."""
        return self._stdout

    def pump(self, readable: bool) -> None:
        """Read what ``select`` found on stdout; without anything to read, notice that the runner exited."""
        if readable:
            self._read_available()
        elif self.popen.poll() is not None:
            self._end()

    def expect_run(self, run_id: str) -> int:
        """Take from now on only frames of ``run_id``; returns how many events of earlier runs were dropped.

        A session's run that was not followed to its ``done`` (the engine failed, or gave up) leaves frames
        behind, and its cell may still be running: they must not pass for the next cell's.
        """
        self._decoder.expect_run(run_id)
        stale = [e for e in self._pending if not isinstance(e, RunnerExit | Hello)]
        self._pending = deque(e for e in self._pending if isinstance(e, RunnerExit | Hello))
        return len(stale)

    @property
    def foreign(self) -> int:
        """Frames dropped so far because they belonged to another run."""
        return self._decoder.foreign

    def _read_available(self) -> None:
        data = os.read(self._stdout, 1 << 16)
        if not data:
            self._end()
            return
        for event in self._decoder.feed(data):
            if isinstance(event, Noise):
                self.diagnostics.append(event.line)
            else:
                self._pending.append(event)

    def _end(self) -> None:
        self._ended = True
        for event in self._decoder.close():
            if not isinstance(event, Noise):
                self._pending.append(event)
        code = self.popen.wait()
        self._stderr.join(0.5)
        self._pending.append(RunnerExit(code, "\n".join(self.diagnostics)))
        assert self.popen.stdout is not None
        self.popen.stdout.close()

    def _read_diagnostics(self, pipe: IO[bytes]) -> None:
        for line in iter(pipe.readline, b""):
            self.diagnostics.append(line.decode("utf-8", "replace").rstrip())

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the runner's process group (the cell's subprocesses included)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(self.pid, signum)

    def interrupt(self) -> None:
        """SIGINT to the runner's own process group: the cell gets KeyboardInterrupt."""
        self.signal(signal.SIGINT)

    def send(self, command: Mapping[str, object]) -> bool:
        """Write one JSON command to a session runner's stdin; ``False`` if the runner is gone."""
        return self.send_bytes(json.dumps(command).encode() + b"\n")

    def send_bytes(self, data: bytes) -> bool:
        """Write ``data`` to the runner's stdin; ``False`` if the runner is gone."""
        stdin = self.popen.stdin
        if stdin is None:
            return False
        try:
            stdin.write(data)
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return False
        return True

    def _write_and_close(self, data: bytes) -> None:
        self.send_bytes(data)
        assert self.popen.stdin is not None
        with contextlib.suppress(OSError):
            self.popen.stdin.close()

    def stop(self, grace: float) -> int | None:
        """Wait up to ``grace`` seconds for the runner to exit, then kill its group; return the exit code."""
        try:
            return self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait()
        finally:
            if self.popen.stdin is not None:
                with contextlib.suppress(OSError):
                    self.popen.stdin.close()

    @property
    def alive(self) -> bool:
        """Whether the runner process is still running."""
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The runner's exit code, ``None`` while it runs."""
        return self.popen.poll()


def daemon_thread(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True, name="gpu-offload-runner-io")
    thread.start()
    return thread
