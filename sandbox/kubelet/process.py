"""One container (or exec) process: started clean, output pumped, stopped with a grace period.

Every process gets its own session (so a signal reaches its children too) and, on Linux, dies with the
sandbox even if the sandbox is killed without cleaning up (``PR_SET_PDEATHSIG``). The registry below lets
the sandbox prove that nothing it started is still alive.

With an :class:`~gpu_offload.sandbox.kubelet.isolation.Isolation` (root only) the process is the container's shim
(``nsinit.py``): SIGTERM goes to it alone and it hands it to the command, as a runtime signals a container's
PID 1; SIGKILL ends its PID namespace, so no child of the container survives, whatever its session.
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

from .isolation import Isolation, shim_argv

OutputSink = Callable[[str, bytes], None]
"""``sink(stream, data)`` with stream ``"stdout"`` or ``"stderr"``; called on the event loop."""

_PR_SET_PDEATHSIG = 1
_LIVE: weakref.WeakSet[ContainerProcess] = weakref.WeakSet()


@dataclass(frozen=True)
class _Session:
    owner: str
    """Who started it (a kubelet's tag): several sandboxes run side by side in one test process."""
    leader_start: int | None
    """When its leader started (clock ticks after boot): tells the session from a later one whose leader was
    given the same pid (pids wrap at 32768 on many machines, within one test run)."""


_SESSIONS: dict[int, _Session] = {}  # every session started here, by id: the pid of the process that leads it


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

    def __init__(self, proc: asyncio.subprocess.Process, sink: OutputSink, isolated: bool = False,
                 owner: str = "") -> None:
        self._proc = proc
        self.isolated = isolated
        self._pumps = [asyncio.ensure_future(self._pump(name, stream, sink))
                       for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)) if stream]
        self.exit: Exit | None = None
        self.owner = owner
        _LIVE.add(self)
        _SESSIONS[proc.pid] = _Session(owner, _start_time(proc.pid))

    @classmethod
    async def start(cls, argv: Sequence[str], env: dict[str, str], cwd: Path, sink: OutputSink,
                    stdin: bool = False, isolation: Isolation | None = None,
                    join: ContainerProcess | None = None, owner: str = "") -> ContainerProcess:
        """Start ``argv`` (``argv[0]`` looked up on ``env["PATH"]``); raises OSError if it cannot run.

        ``isolation``: run it shut in (see ``nsinit.py``); ``join``: in the namespaces of that container;
        ``owner``: the tag :func:`live_processes` finds it by."""
        if isolation is None:
            proc = await cls._spawn(argv, env, cwd, stdin)
            return cls(proc, sink, owner=owner)
        status_read, status_write = os.pipe()
        failure = ""
        try:
            proc = await cls._spawn(shim_argv(argv, cwd, isolation, status_write,
                                              join.init_pid() if join is not None else None),
                                    env, cwd, stdin, (status_write,))
        finally:
            os.close(status_write)
        # Running only once the command is exec'd, as a runtime reports a container started
        reading = asyncio.ensure_future(asyncio.to_thread(_read_all, status_read))
        try:
            failure = await asyncio.wait_for(asyncio.shield(reading), 60)
        except asyncio.TimeoutError:
            failure = "the container's shim did not start it within 60 s"
        except BaseException:  # cancelled meanwhile: nothing of it may stay behind
            failure = "cancelled"
            raise
        finally:
            if failure:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.shield(reading)  # its writers are dead: the read ends
                await proc.wait()
            os.close(status_read)
        if failure:
            raise OSError(failure)
        return cls(proc, sink, isolation is not None, owner)

    @staticmethod
    async def _spawn(argv: Sequence[str], env: dict[str, str], cwd: Path, stdin: bool,
                     pass_fds: tuple[int, ...] = ()) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=str(cwd), start_new_session=True, preexec_fn=_die_with_parent,
            pass_fds=pass_fds, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

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

    def init_pid(self) -> int | None:
        """The pid (as the host sees it) of an isolated container's PID 1, None if gone or not isolated."""
        if not self.isolated:
            return None
        children = _children(self._proc.pid)
        return children[0] if children else None

    def rss_bytes(self) -> int:
        """Resident memory of the container's command and what it started (0 when unknown or gone)."""
        if not self.isolated:
            return _rss(self._proc.pid)
        init = self.init_pid()
        tree, total = list(_children(init)) if init else [], 0
        while tree:  # the shim and PID 1 are the runtime's, as their memory is outside a container's cgroup
            pid = tree.pop()
            total += _rss(pid)
            tree.extend(_children(pid))
        return total

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process and everything it started (no error if already gone); to an isolated
        container's shim alone, except SIGKILL, which ends its namespace."""
        if self.exit is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self.isolated and sig != signal.SIGKILL:
                    os.kill(self._proc.pid, sig)
                else:
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


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(p) for p in children.read().split()]
    except (OSError, ValueError):
        return []


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


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


def live_processes(owner: str | None = None) -> list[int]:
    """Every live process in a session started here (by ``owner`` if given), children and grandchildren
    included.

    Empty once the sandbox stopped everything it ran. Without /proc, only the processes it started.
    """
    sessions = list(_SESSIONS.items())  # before reading /proc: a session started since is not yet in it
    members = _sessions_on_linux()
    if members is None:
        return [p.pid for p in list(_LIVE) if p.exit is None and owner in (None, p.owner)]
    live = []
    for sid, session in sessions:
        started = _start_time(sid)
        if not members.get(sid) or (started is not None and started != session.leader_start):
            # Nothing can join an empty session, and a pid is only reused once its session is empty: this
            # one is over for good, and forgetting it keeps a later process given its pid out of the count
            if _SESSIONS.get(sid) is session:
                del _SESSIONS[sid]
        elif owner is None or session.owner == owner:
            live.extend(members[sid])
    return sorted(live)


def kill_all() -> None:
    """Last resort at exit: SIGKILL every process group still alive."""
    for proc in list(_LIVE):
        proc.signal_group(signal.SIGKILL)
