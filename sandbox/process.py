"""One container (or exec) process: started clean, output pumped, stopped with a grace period.

Every process gets its own session (so a signal reaches its children too) and, on Linux, dies with the
sandbox even if the sandbox is killed without cleaning up (``PR_SET_PDEATHSIG``). The registry below lets
the sandbox prove that nothing it started is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

OutputSink = Callable[[str, bytes], None]
"""``sink(stream, data)`` with stream ``"stdout"`` or ``"stderr"``; called on the event loop."""

_PR_SET_PDEATHSIG = 1
_LIVE: weakref.WeakSet[ContainerProcess] = weakref.WeakSet()
_SESSIONS: set[int] = set()  # every session started here: its id is the pid of the process that leads it


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Exit:
    """How a process ended, in the kubelet's terms."""

    code: int
    """The exit code a kubelet reports: the process's own, or 128 + the signal that killed it."""
    signal: int | None = None


class ContainerProcess:
    """A running local process standing in for a container."""

    def __init__(self, proc: asyncio.subprocess.Process, sink: OutputSink) -> None:
        self._proc = proc
        self._pumps = [asyncio.ensure_future(self._pump(name, stream, sink))
                       for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)) if stream]
        self.exit: Exit | None = None
        _LIVE.add(self)
        _SESSIONS.add(proc.pid)

    @classmethod
    async def start(cls, argv: Sequence[str], env: dict[str, str], cwd: Path, sink: OutputSink,
                    stdin: bool = False) -> ContainerProcess:
        """Start ``argv`` (``argv[0]`` looked up on ``env["PATH"]``); raises OSError if it cannot run."""
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=str(cwd), start_new_session=True, preexec_fn=_die_with_parent,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return cls(proc, sink)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @staticmethod
    async def _pump(name: str, stream: asyncio.StreamReader, sink: OutputSink) -> None:
        while True:
            data = await stream.read(65536)
            if not data:
                return
            sink(name, data)

    async def write_stdin(self, data: bytes) -> None:
        """Send ``data`` to the process's stdin (ignored once it has closed it)."""
        if self._proc.stdin is None or self._proc.stdin.is_closing():
            return
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close_stdin(self) -> None:
        """End of input for the process."""
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()

    async def wait(self) -> Exit:
        """Wait for the process to end and its output to be drained."""
        code = await self._proc.wait()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        self.exit = Exit(128 - code, -code) if code < 0 else Exit(code)
        _LIVE.discard(self)
        return self.exit

    def rss_bytes(self) -> int:
        """Resident memory of the process (Linux ``/proc``; 0 when unknown or gone)."""
        try:
            with open(f"/proc/{self._proc.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process and everything it started (no error if already gone)."""
        if self.exit is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

    async def stop(self, grace: float) -> Exit:
        """SIGTERM, then SIGKILL after ``grace`` seconds, as a kubelet stops a container."""
        if self.exit is not None:
            return self.exit
        self.signal_group(signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.shield(self.wait()), max(grace, 0.0))
        except asyncio.TimeoutError:
            self.signal_group(signal.SIGKILL)
            return await self.wait()


def _sessions_on_linux() -> dict[int, list[int]] | None:
    # session id -> live (non-zombie) pids, read from /proc; None where there is no /proc
    if not os.path.isdir("/proc/self"):
        return None
    members: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z":
            members.setdefault(int(fields[3]), []).append(int(entry.name))
    return members


def session_members(session: int) -> list[int]:
    """Live pids in ``session`` (a container process and whatever it started that stayed in it)."""
    members = _sessions_on_linux()
    if members is None:
        return [p.pid for p in list(_LIVE) if p.pid == session and p.exit is None]
    return sorted(members.get(session, []))


def live_processes() -> list[int]:
    """Every live process in a session started here, children and grandchildren included.

    Empty once the sandbox stopped everything it ran. Without /proc, only the processes it started.
    """
    members = _sessions_on_linux()
    if members is None:
        return [p.pid for p in list(_LIVE) if p.exit is None]
    return sorted(pid for sid in _SESSIONS for pid in members.get(sid, []))


def kill_all() -> None:
    """Last resort at exit: SIGKILL every process group still alive."""
    for proc in list(_LIVE):
        proc.signal_group(signal.SIGKILL)
