"""One node of a distributed run: start the node's ranks as runner processes and relay their frames.

A bundle with a ``ranks`` field (``{"nodes": N, "procs_per_node": P, "out_rank": R}``) given to
``runner.pyz --bundle PATH|-`` makes that runner the node's *launcher*, as ``torchrun`` is for its workers:
it starts P runner processes (``--rank R``) with the environment torchrun gives, hands each the same bundle
on stdin, and writes all their frames on its own stdout in one ``seq`` order (what a log follower resumes
by), with each frame's ``rank`` field set to the rank it came from. The local backend starts one launcher
per node as a process; the kubernetes backend starts one per pod of an Indexed Job. See
``docs/distributed.md`` for the interface.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from .lines import LineSplitter, Overlong
from .signals import block_in_this_thread
from .wire import MARK, MAX_FRAME_BYTES, NO_RUN, run_token

INDEX_ENV = "JOB_COMPLETION_INDEX"
"""Set by Kubernetes in every pod of an Indexed Job: the node's group rank when ``--group-rank`` is not given."""
STANDALONE_ADDR = "127.0.0.1"
READER_JOIN_SECONDS = 2.0
"""How long the launcher waits for a rank's stdout to end after the rank exited (a subprocess of the
cell may hold the pipe open)."""


@dataclass(frozen=True)
class NodeShape:
    """Where one node sits in a distributed run."""

    nodes: int
    procs_per_node: int
    out_rank: int
    group_rank: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def ranks(self) -> range:
        """The global ranks this node runs."""
        first = self.group_rank * self.procs_per_node
        return range(first, first + self.procs_per_node)


def node_shape(spec: Mapping[str, Any], group_rank: int | None, environ: Mapping[str, str]) -> NodeShape:
    """The node's shape from the bundle's ``ranks`` and the group rank (``--group-rank``, else the Indexed
    Job's completion index, else 0 for a single node); ``ValueError`` with one sentence if it does not fit."""
    try:
        nodes, procs, out_rank = int(spec["nodes"]), int(spec["procs_per_node"]), int(spec["out_rank"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the bundle's ranks field {dict(spec)!r} lacks nodes, procs_per_node or out_rank") from exc
    if nodes < 1 or procs < 1 or not 0 <= out_rank < nodes * procs:
        raise ValueError(f"the bundle's ranks field {dict(spec)!r} is not a valid shape")
    if group_rank is None:
        index = environ.get(INDEX_ENV)
        if index is not None and index.isdigit():
            group_rank = int(index)
        elif nodes == 1:
            group_rank = 0
        else:
            raise ValueError(
                f"a {nodes}-node run needs this node's group rank: pass --group-rank G or run it as a pod of an "
                f"Indexed Job (${INDEX_ENV})"
            )
    if not 0 <= group_rank < nodes:
        raise ValueError(f"--group-rank {group_rank} is outside the run's {nodes} node(s)")
    return NodeShape(nodes, procs, out_rank, group_rank)


def master(environ: Mapping[str, str], nodes: int) -> tuple[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` from the launcher's environment; a single node without them picks
    the loopback address and a free port (``torchrun --standalone``)."""
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr and port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"MASTER_PORT={port!r} is not a TCP port number")
        return addr, port
    if nodes > 1:
        raise ValueError(
            f"a {nodes}-node run needs MASTER_ADDR and MASTER_PORT in the launcher's environment (the address "
            "of the group-rank-0 node and a free port there)"
        )
    return STANDALONE_ADDR, str(free_port())


def free_port() -> int:
    """A TCP port free on this machine now (as torchrun's standalone mode picks one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((STANDALONE_ADDR, 0))
        return int(probe.getsockname()[1])


def rank_environment(
    shape: NodeShape, local_rank: int, base: Mapping[str, str], addr: str, port: str, run_id: str
) -> dict[str, str]:
    """The environment ``torchrun`` gives worker ``local_rank`` of this node, so ``init_process_group()``
    with ``env://`` works; ``OMP_NUM_THREADS=1`` unless the node sets it (several ranks share the cores)."""
    env = dict(base)
    rank = shape.ranks[local_rank]
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        GROUP_RANK=str(shape.group_rank),
        ROLE_RANK=str(rank),
        WORLD_SIZE=str(shape.world_size),
        ROLE_WORLD_SIZE=str(shape.world_size),
        LOCAL_WORLD_SIZE=str(shape.procs_per_node),
        GROUP_WORLD_SIZE=str(shape.nodes),
        MASTER_ADDR=addr,
        MASTER_PORT=port,
        TORCHELASTIC_RUN_ID=run_id or "gpu-offload",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class Relay:
    """All ranks' frames on the launcher's stdout: one ``seq`` order, each frame's ``rank`` field set by the
    launcher to the rank process it came from (a rank cannot write another's)."""

    def __init__(self, nonce: str, run_id: str | None, out: int) -> None:
        self._prefix = f"{MARK} {nonce} ".encode("ascii")
        self._run = NO_RUN if run_id is None else run_token(run_id)
        self._out = out
        self._seq = 0
        self._lock = threading.Lock()
        self.finished: set[int] = set()
        """Ranks whose ``done`` frame went out."""

    def forward(self, rank: int, line: bytes) -> bool:
        """Relay one frame line of ``rank`` (without its newline); ``False`` if it is not a frame."""
        if not line.startswith(self._prefix):
            return False
        fields = line[len(self._prefix):].split(b" ", 4)  # seq run rank kind payload
        if len(fields) != 5 or not fields[0].isdigit():
            return False
        _seq, run, _rank, kind, payload = fields
        with self._lock:
            head = self._prefix + b"%d %s %d %s " % (self._seq, run, rank, kind)
            self._write(head + payload + b"\n")
            if kind == b"done":
                self.finished.add(rank)
        return True

    def emit(self, rank: int, kind: str, payload: str) -> None:
        """A frame of the launcher's own on behalf of ``rank`` (e.g. the rank's process died)."""
        with self._lock:
            # the launcher's own payloads are one short sentence: far below the frame limit
            self._write(f"{self._prefix.decode()}{self._seq} {self._run} {rank} {kind} {payload}\n".encode("ascii"))

    def _write(self, data: bytes) -> None:
        self._seq += 1
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._out, view):]
        except BrokenPipeError:
            os._exit(141)  # the engine is gone: nobody is left to report to


class Node:
    """The node's rank processes while they run.

    One-shot (``first`` is the bundle): each rank gets the bundle on stdin, then end of input. Session
    (``first`` is the greeting): each rank's stdin stays open for the commands :meth:`forward` passes on.
    """

    def __init__(self, shape: NodeShape, run_id: str, first: bytes, relay: Relay, *, session: bool = False) -> None:
        self.shape = shape
        self.relay = relay
        self._first = first
        self._run_id = run_id
        self._session = session
        self.children: list[tuple[int, subprocess.Popen[bytes]]] = []
        self._readers: list[threading.Thread] = []
        self._signalled: int | None = None
        self._closing = False

    def start(self, environ: Mapping[str, str]) -> None:
        """Start the node's ranks (each told to end itself if this launcher dies)."""
        addr, port = master(environ, self.shape.nodes)
        mode = ["--session"] if self._session else ["--bundle", "-"]
        argv = [sys.executable, sys.argv[0], *mode, "--parent-pid", str(os.getpid())]
        for local_rank, rank in enumerate(self.shape.ranks):
            env = rank_environment(self.shape, local_rank, environ, addr, port, self._run_id)
            child = subprocess.Popen([*argv, "--rank", str(rank)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
            if self._session:  # the greeting fits the pipe: written here, before any command is passed on
                self._write(child, self._first)
            self.children.append((rank, child))
            if self._signalled is not None:  # an interrupt that came while the node was starting
                child.send_signal(self._signalled)
            reader = threading.Thread(target=self._relay, args=(rank, child), daemon=True, name=f"gpuo-rank-{rank}")
            reader.start()
            self._readers.append(reader)

    def _relay(self, rank: int, child: subprocess.Popen[bytes]) -> None:
        block_in_this_thread()
        assert child.stdin is not None and child.stdout is not None
        if not self._session:  # a bundle may exceed the pipe: written beside the reading of frames
            self._write(child, self._first)
            with contextlib.suppress(OSError):
                child.stdin.close()
        _copy_frames(rank, child.stdout, self.relay)
        if self._session and not self._closing:
            self._lost_in_session(rank, child)

    @staticmethod
    def _write(child: subprocess.Popen[bytes], data: bytes) -> None:
        assert child.stdin is not None
        with contextlib.suppress(OSError):  # a rank that died at once: its exit is reported by wait()
            child.stdin.write(data)
            child.stdin.flush()

    def forward(self, command: bytes) -> None:
        """Pass one session command line on to every rank."""
        for _rank, child in self.children:
            self._write(child, command)

    def expect_end(self) -> None:
        """The ranks' ends are expected from now on, not reported as lost."""
        self._closing = True

    def close(self) -> None:
        """End of the session's commands: every rank's input ends, so each session ends (the ranks' ends
        are expected from now on, not reported as lost)."""
        self.expect_end()
        for _rank, child in self.children:
            with contextlib.suppress(OSError):
                assert child.stdin is not None
                child.stdin.close()

    def _lost_in_session(self, rank: int, child: subprocess.Popen[bytes]) -> None:
        """A rank's session ended on its own: the process group is broken, so the node's session ends."""
        code = child.wait()
        if self._closing:
            return
        self._report_lost(rank, code, "its session")
        self.signal(signal.SIGTERM)
        from . import watchdog

        watchdog.hard_exit_later(1)

    def signal(self, signum: int) -> None:
        """Pass a signal on to every rank still running (and to those started after it)."""
        self._signalled = signum
        for _rank, child in self.children:
            with contextlib.suppress(ProcessLookupError):
                if child.poll() is None:
                    child.send_signal(signum)

    def wait(self) -> int:
        """Wait for every rank; report a rank that ended without its ``done``; the node's exit code."""
        codes = []
        for (rank, child), reader in zip(self.children, self._readers, strict=True):
            code = child.wait()
            reader.join(READER_JOIN_SECONDS)
            codes.append(code)
            if rank not in self.relay.finished and not self._session:
                self._report_lost(rank, code, "its cell")
        failed = [code for code in codes if code != 0]
        return 0 if not failed else (failed[0] if failed[0] > 0 else 1)

    def _report_lost(self, rank: int, code: int, what: str) -> None:
        import json

        cause = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        text = (f"the process of rank {rank} (node {self.shape.group_rank}) ended before {what} finished "
                f"({cause}); if the cell called os._exit or ran out of memory, fix that and run it again")
        self.relay.emit(rank, "error", json.dumps({"ename": "RankDied", "evalue": text, "traceback": []}))
        self.relay.emit(rank, "done", json.dumps({"status": "error", "elapsed": 0.0}))


def _copy_frames(rank: int, stdout: IO[bytes], relay: Relay) -> None:
    lines = LineSplitter(4 * MAX_FRAME_BYTES)
    fd = stdout.fileno()
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        found = lines.feed(data) if data else lines.close()
        for line in found:
            if isinstance(line, Overlong) or not relay.forward(rank, line):
                # stray interpreter output: diagnostics, never a frame
                head = line.head if isinstance(line, Overlong) else line[:200]
                sys.stderr.write(f"rank {rank}: {head.decode('utf-8', 'replace')}\n")
        if not data:
            return


def launch(bundle: Mapping[str, Any], data: bytes, group_rank: int | None, parent_pid: int | None) -> int:
    """Run this node's ranks to their end; returns the launcher's exit code (0: every rank ``ok``).

    SIGINT and SIGTERM are passed on to every rank (their cells get KeyboardInterrupt); when the parent
    dies, the ranks are terminated and the launcher ends, taking its process group along.
    """
    shape = node_shape(bundle["ranks"], group_rank, os.environ)
    relay = Relay(str(bundle["nonce"]), str(bundle["run_id"]), os.dup(1))
    node = Node(shape, str(bundle["run_id"]), data, relay)
    _watch(node, parent_pid)
    node.start(os.environ)
    return node.wait()


def serve_node(nonce: str, spec: Mapping[str, Any], group_rank: int | None, parent_pid: int | None) -> int:
    """A distributed session's node: the ranks are session runners, each session command on stdin is
    passed on to all of them, and end of stdin (or ``exit``) ends them. A rank whose session ends on its
    own ends the node's (the others would wait for it in every collective)."""
    from .secrecy import greeting

    shape = node_shape(spec, group_rank, os.environ)
    relay = Relay(nonce, None, os.dup(1))  # its own frames (a rank lost) belong to no one run
    node = Node(shape, f"session-{os.getpid()}", greeting(nonce), relay, session=True)
    _watch(node, parent_pid)

    def terminate(number: int, _frame: Any) -> None:
        # the ranks' input stays open: a rank whose input ended would take that as `exit`, and skip the
        # checkpoint the kernel armed for SIGTERM (docs/sessions.md); each ends on the signal itself
        node.expect_end()
        node.signal(number)
        raise _Terminated

    signal.signal(signal.SIGTERM, terminate)  # a pod's deletion: the ranks' sessions end, then the node's
    node.start(os.environ)
    try:
        with os.fdopen(0, "rb") as commands:
            for line in iter(commands.readline, b""):
                if len(line) < 64 and _is_exit(line):  # (not parsing every large run command)
                    # passed on first: a rank told `exit` writes no checkpoint at the SIGTERM that follows
                    # (the pod's deletion); its input then ends below
                    node.forward(line)
                    break
                node.forward(line)
    except _Terminated:
        node.wait()
        return TERMINATED_EXIT
    node.close()
    return node.wait()


class _Terminated(Exception):
    pass


TERMINATED_EXIT = 143


def _is_exit(line: bytes) -> bool:
    import json

    try:
        return bool(json.loads(line).get("op") == "exit")
    except (ValueError, AttributeError):
        return False


def _watch(node: Node, parent_pid: int | None) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, _frame: node.signal(number))
    if parent_pid is not None:
        from . import watchdog

        def parent_died() -> None:
            node.signal(signal.SIGTERM)
            watchdog.hard_exit_later(1)

        watchdog.arm(parent_pid, parent_died)
