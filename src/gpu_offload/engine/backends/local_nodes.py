"""A distributed run or session on this machine (``--nodes N --procs-per-node P``), as ``torchrun
--standalone`` runs one: one node launcher process per node (the runner given a ``ranks`` field,
``--group-rank G``), all meeting at a free port on the loopback address. Each launcher starts its node's P
ranks; :class:`NodeProcesses` reads and drives the launchers as one runner, whose frames carry their ranks.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Mapping

from ...runner.ranks import STANDALONE_ADDR, free_port
from ...runner.secrecy import greeting
from .base import Job, Ranks, RunEvent, RunnerExit
from .local_process import RunnerProcess


class NodeProcesses:
    """The launchers of one distributed run, with what the backend asks of one :class:`RunnerProcess`;
    their events come as one stream that ends with one :class:`RunnerExit` once every launcher has ended."""

    def __init__(self, processes: list[RunnerProcess]) -> None:
        self.processes = processes
        self._codes: list[int | None] = []
        self._details: list[str] = []
        self._over = False

    @property
    def pid(self) -> int:
        """The group-rank-0 launcher's process id (what ``%gpu_offload sessions`` shows)."""
        return self.processes[0].pid

    @property
    def alive(self) -> bool:
        """Whether every launcher still runs (one gone breaks the process group)."""
        return all(process.alive for process in self.processes)

    @property
    def returncode(self) -> int | None:
        """The first failing launcher's exit code, 0 if none failed, ``None`` while all run."""
        codes = [process.returncode for process in self.processes]
        failed = [code for code in codes if code]
        return failed[0] if failed else (None if None in codes else 0)

    @property
    def foreign(self) -> int:
        return sum(process.foreign for process in self.processes)

    def expect_run(self, run_id: str) -> int:
        return sum(process.expect_run(run_id) for process in self.processes)

    def send(self, command: Mapping[str, object]) -> bool:
        """A session command to every launcher, which passes it on to its ranks."""
        return all([process.send(command) for process in self.processes])

    def next_event(self, timeout: float) -> RunEvent | None:
        """The next event of any launcher within ``timeout`` seconds, else ``None``."""
        deadline = time.monotonic() + timeout
        while True:
            for process in self.processes:
                event = process.take()
                if isinstance(event, RunnerExit):
                    self._codes.append(event.code)
                    if event.detail:
                        self._details.append(event.detail)
                elif event is not None:
                    return event
            live = [process for process in self.processes if not process.ended]
            if not live:
                return self._last()
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select(live, [], [], max(remaining, 0.0))
            for process in live:
                process.pump(process in readable)
            if not readable and remaining <= 0 and not any(process.ended for process in live):
                return None

    def _last(self) -> RunnerExit | None:
        if self._over:
            return None
        self._over = True
        failed = [code for code in self._codes if code != 0]
        return RunnerExit(failed[0] if failed else 0, "\n".join(self._details))

    def interrupt(self) -> None:
        """SIGINT to each launcher, which passes it on to its ranks (their cells get KeyboardInterrupt)."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)

    def signal(self, signum: int) -> None:
        """``signum`` to every launcher's process group (its ranks are in it)."""
        for process in self.processes:
            process.signal(signum)

    def stop(self, grace: float) -> int | None:
        """Wait up to ``grace`` seconds in all for the launchers, then kill their groups; the first failing
        exit code (0 if none failed)."""
        deadline = time.monotonic() + grace
        codes = [process.stop(max(0.0, deadline - time.monotonic())) for process in self.processes]
        failed = [code for code in codes if code]
        return failed[0] if failed else 0


def start_nodes(
    job: Job, ranks: Ranks, env: Mapping[str, str], argv: Callable[..., list[str]], *, session: bool = False
) -> NodeProcesses:
    """Start one launcher per node (``session``: a distributed session's, greeted with the nonce and the
    shape); one that cannot start takes those already started down with it."""
    node_env = {**env, "MASTER_ADDR": STANDALONE_ADDR, "MASTER_PORT": str(free_port())}
    mode = ("--session",) if session else ("--bundle", "-")
    first = greeting(job.nonce, ranks.bundle_field()) if session else job.bundle
    processes: list[RunnerProcess] = []
    try:
        for group_rank in range(ranks.nodes):
            processes.append(RunnerProcess(
                argv(*mode, "--group-rank", str(group_rank)), node_env, job.nonce, first,
                interactive=session, run_id=None if session else job.run_id, ranks=ranks.world_size,
            ))
    except BaseException:
        for process in processes:
            process.signal(signal.SIGKILL)
            process.stop(0)
        raise
    return NodeProcesses(processes)
