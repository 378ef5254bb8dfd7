"""A distributed run on this machine (``--nodes N --procs-per-node P``), as ``torchrun --standalone`` runs one:
one node launcher process per node (the runner given a bundle with ``ranks``, ``--group-rank G``), all of
them meeting at a free port on the loopback address. Each launcher starts its node's P ranks; this run
reads every launcher's frames, which carry their ranks.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Mapping

from ..runner.ranks import STANDALONE_ADDR, free_port
from .base import Job, Ranks, RunEvent, RunnerExit
from .local import RunnerProcess, _LocalRun


def start_nodes(job: Job, ranks: Ranks, env: Mapping[str, str], argv: Callable[..., list[str]]) -> NodesRun:
    """Start one launcher per node; any that cannot start takes those already started down with it."""
    node_env = {**env, "MASTER_ADDR": STANDALONE_ADDR, "MASTER_PORT": str(free_port())}
    processes: list[RunnerProcess] = []
    try:
        for group_rank in range(ranks.nodes):
            processes.append(RunnerProcess(
                argv("--bundle", "-", "--group-rank", str(group_rank)), node_env, job.nonce, job.bundle,
                interactive=False, run_id=job.run_id, ranks=ranks.world_size,
            ))
    except BaseException:
        for process in processes:
            process.signal(signal.SIGKILL)
            process.stop(0)
        raise
    return NodesRun(processes)


class NodesRun(_LocalRun):
    """The launchers of one distributed run, read as one stream of rank events; ends with one
    :class:`RunnerExit` once every launcher has exited."""

    def __init__(self, processes: list[RunnerProcess]) -> None:
        self.processes = processes
        self._codes: list[int | None] = []
        self._details: list[str] = []
        self._over = False

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.magics.backends.base.Run.next_event`."""
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
            if not readable and remaining <= 0 and all(not p.ended for p in live):
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

    def kill(self) -> None:
        """SIGKILL to every launcher's process group (its ranks are in it)."""
        for process in self.processes:
            process.signal(signal.SIGKILL)

    def release(self, grace: float) -> int | None:
        """Wait up to ``grace`` seconds in all for the launchers, then kill their groups; the first failing
        exit code (0 if none failed)."""
        deadline = time.monotonic() + grace
        codes = [process.stop(max(0.0, deadline - time.monotonic())) for process in self.processes]
        failed = [code for code in codes if code]
        return failed[0] if failed else 0
