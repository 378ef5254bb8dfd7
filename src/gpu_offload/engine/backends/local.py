"""The embedded local backend: the runner zipapp as a subprocess of the kernel.

Each runner starts in its own session (``start_new_session=True``): Jupyter's interrupt signals the
kernel's whole process group, and a runner must receive an interrupt only from the engine, which then
signals the runner's own group. ``--parent-pid`` makes a runner end itself when the kernel dies.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ...runner.checkpoint import DEFAULT_LIMIT
from ...runner.frames import Done, RunnerWarning
from ...runner.secrecy import greeting
from ..errors import OffloadUsageError
from .base import (
    InventorySource,
    Job,
    RunEvent,
    RunnerExit,
    RunRequest,
    SessionInfo,
    Transfer,
    stale_frames_note,
)
from .checkpoint_book import SessionLost, restored_line
from .local_process import RunnerProcess, daemon_thread, runner_environment
from .local_state import SavedCheckpoint, SessionCheckpoints

if TYPE_CHECKING:
    from .local_nodes import NodeProcesses

KILLED_WITHIN = 5.0
"""Seconds to wait for a runner sent SIGKILL to be reaped (a guard: it takes milliseconds)."""
INLINE_BUNDLE_LIMIT = 1 << 20


class _LocalRun:
    """What every local run says about itself."""

    cluster = "local"
    """Runners of this backend run on the kernel's machine."""

    def progress(self) -> str:
        """Nothing to add: a local runner starts at once."""
        return ""


class OneShotRun(_LocalRun):
    """A bundle run by a runner started for it alone, or a one-shot distributed run: its node launchers
    (:class:`~.local_nodes.NodeProcesses`, driven as one runner) until they have all ended."""

    def __init__(self, process: RunnerProcess | NodeProcesses) -> None:
        self.process = process

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.engine.backends.base.Run.next_event`."""
        return self.process.next_event(timeout)

    def interrupt(self) -> None:
        """The cell (every rank's) gets KeyboardInterrupt."""
        self.process.interrupt()

    def kill(self) -> None:
        """SIGKILL to the runner's process group (every launcher's, with its ranks)."""
        self.process.signal(signal.SIGKILL)

    def release(self, grace: float) -> int | None:
        """Wait for the runner to exit (killed after ``grace`` s); the first failing launcher's exit code."""
        return self.process.stop(grace)


class LocalSession:
    """A warm runner whose namespace persists across cells."""

    def __init__(self, name: str, process: RunnerProcess | NodeProcesses, placement: RunRequest) -> None:
        self.name = name
        self.process = process
        self.placement = placement
        self.runs = 0
        self.busy = False
        self.auto_limit: int | None = None
        """Checkpoint after every cell that ends ok, with this limit (``None``: only when asked)."""
        self.background: threading.Thread | None = None
        self.auto_note: str | None = None
        """What the last automatic checkpoint did, told to the next cell."""

    def settle(self) -> None:
        """Wait for a checkpoint being written in the background (the runner answers one command at a time)."""
        if self.background is not None:
            self.background.join()
            self.background = None


class SessionRun(_LocalRun):
    """A bundle run inside a session; ends with the ``done`` frame, the runner stays up.

    The run's command is written to the runner when the run is first followed (or interrupted), not when it is
    submitted: the engine's bookkeeping between the two (the run's record, its cancel handle) is done by then,
    and the kernel goes straight from the write to waiting for the frames. The runner the write wakes often
    takes the kernel's CPU at once (on a busy machine), and work the kernel left for after the write would
    wait for the whole cell, then for the CPU again.
    """

    def __init__(
        self,
        session: LocalSession,
        bundle: Path | None,
        on_death: Callable[[str, int | None], None],
        note: str | None = None,
        stale: int = 0,
        command: Mapping[str, object] | None = None,
        on_unsent: Callable[[str], None] | None = None,
    ) -> None:
        self.session = session
        self._bundle = bundle
        self._on_death = on_death
        self._command = command
        """The run command, until it is written (:meth:`_send`)."""
        self._on_unsent = on_unsent
        """Told the session's name when the command could not be written (the runner is gone)."""
        self._note = note
        self._dropped = stale - session.process.foreign  # plus the decoder's count when the run ends
        self._done: Done | None = None
        self.ended_ok = False
        self.on_ok: Callable[[LocalSession], None] | None = None

    def _send(self) -> None:
        command, self._command = self._command, None
        if command is not None and not self.session.process.send(command) and self._on_unsent is not None:
            self._on_unsent(self.session.name)  # its exit is what the next event reads

    def next_event(self, timeout: float) -> RunEvent | None:
        """See :meth:`gpu_offload.engine.backends.base.Run.next_event`."""
        if self._command is not None:
            self._send()
        if self._note is not None:
            note, self._note = self._note, None
            return RunnerWarning(-1, note)
        if self._done is not None:
            done, self._done = self._done, None
            return done
        event = self.session.process.next_event(timeout)
        if isinstance(event, RunnerExit):
            self._on_death(self.session.name, event.code)
        elif isinstance(event, Done):
            self.ended_ok = event.status == "ok"
            dropped = self._dropped + self.session.process.foreign
            if dropped:
                self._done = event
                return RunnerWarning(-1, stale_frames_note(self.session.name, dropped))
        return event

    def interrupt(self) -> None:
        """Ask the session runner to interrupt the cell; the session and its state survive."""
        self._send()  # the run first: an interrupt that overtook it would be dropped as meant for no run
        self.session.process.send({"op": "interrupt"})

    def kill(self) -> None:
        """End the session's runner (its state is lost), and wait for it to be gone: the next cell must find
        the session dead and start a new one, not send its run to a runner that is still dying."""
        self._command = None
        self.session.process.signal(signal.SIGKILL)
        self.session.process.stop(KILLED_WITHIN)

    def release(self, grace: float) -> int | None:
        """Remove the bundle and mark the session idle; the runner stays up (a run never followed was never
        sent: the runner has nothing of it)."""
        self._command = None
        self.session.busy = False
        if self._bundle is not None:
            _unlink(self._bundle)
        if self.ended_ok and self.on_ok is not None:
            self.on_ok(self.session)
        return None


class LocalBackend:
    """Runs runners as subprocesses of this kernel, with this kernel's Python."""

    name = "local"

    def __init__(self, python: str | None = None, runner: Path | None = None) -> None:
        self.python = python or sys.executable
        self._runner = runner
        self._sessions: dict[str, LocalSession] = {}
        self._lost: dict[str, str] = {}
        self._lock = threading.Lock()
        self.checkpoints = SessionCheckpoints()
        shm = Path("/dev/shm")
        shm_dir = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        self._transfer = Transfer(input_transport="shm", output_transport="shm", shm_dir=str(shm_dir))

    def transfer(self, run_id: str) -> Transfer:
        """Buffers go through tmpfs (the runner is on this machine), the same for every run."""
        return self._transfer

    def describe(self) -> str:
        """One line for ``%gpu_offload status``."""
        return f"local backend: runners are subprocesses of this kernel ({self.python})"

    def inventory(self) -> InventorySource | None:
        """No cluster, no donors."""
        return None

    def user_runs(self) -> None:
        """None: a local run ends with the kernel that started it, and the run book lists it."""
        return None

    def trusts(self, cluster: str) -> bool:
        """The runner is a process of the user's own, on this machine (``liqo_peering.trust.LOCAL_BACKEND``)."""
        return True

    def runner_path(self) -> Path:
        """The runner zipapp, built on first use and cached."""
        if self._runner is None:
            from ...runner.build import build_runner

            self._runner = Path(build_runner())
        return self._runner

    def _argv(self, *extra: str) -> list[str]:
        return [self.python, str(self.runner_path()), *extra, "--parent-pid", str(os.getpid())]

    def submit(self, job: Job) -> OneShotRun | SessionRun:
        """Start ``job`` in a new runner, or in its session's warm runner (started on first use), or as
        the nodes of a distributed run (one launcher process per node)."""
        if job.session is not None:
            return self._submit_to_session(job.session, job)
        env = runner_environment(job.request, os.environ)
        if job.request.ranks is not None:
            from .local_nodes import start_nodes

            return OneShotRun(start_nodes(job, job.request.ranks, env, self._argv))
        # the bundle (it holds the nonce) goes through stdin: a named file would be open to the cell's
        # subprocesses, which see its path on the runner's command line
        argv = self._argv("--bundle", "-", *(("--preimport", ",".join(job.preimport)) if job.preimport else ()))
        process = RunnerProcess(argv, env, job.nonce, job.bundle, interactive=False, run_id=job.run_id)
        return OneShotRun(process)

    def _write_bundle(self, job: Job) -> Path:
        # on tmpfs next to the buffers, readable by this user only (a session runner frames with its own
        # nonce, not the bundle's)
        fd, name = tempfile.mkstemp(prefix="gpuo-bundle-", suffix=".pkl", dir=self._transfer.shm_dir)
        with os.fdopen(fd, "wb") as handle:
            handle.write(job.bundle)
        return Path(name)

    def _submit_to_session(self, name: str, job: Job) -> SessionRun:
        placement = job.request
        waiting = self._sessions.get(name)
        if waiting is not None:
            waiting.settle()
        with self._lock:
            current = self._sessions.get(name)
            if current is not None and not current.process.alive:
                current.process.signal(signal.SIGKILL)  # a distributed session's other nodes, if any
                self._died(name, current.process.returncode)
                current = None
            note = self._lost.pop(name, None) if current is None else current.auto_note
            if current is not None:
                current.auto_note = None
            fresh = current is None
            if current is None:
                # a session runner frames every run with one nonce, its first command on stdin
                nonce = secrets.token_hex(16)
                env = runner_environment(placement, os.environ)
                current = self._sessions[name] = LocalSession(name, self._session_process(job, nonce, env),
                                                              placement)
            # the same request (the same magic line, as a notebook repeats it) has the same key: no copies made
            elif current.placement != placement and current.placement.session_key() != placement.session_key():
                raise OffloadUsageError(
                    f"Session `{name}` was started with {current.placement.shape()}; this cell asks "
                    f"for {placement.shape()}. Close it with `%gpu_offload close {name}` to change "
                    "them, or use another --session name."
                )
            if current.busy:
                raise OffloadUsageError(
                    f"Session `{name}` is still running a cell. Wait for it (`%gpu_result`), cancel it, "
                    "or use another --session name."
                )
            current.busy = True
            current.runs += 1
        saved = self.checkpoints.latest(name) if fresh and note is not None else None
        if saved is not None:
            note = f"{note}; {self._resume(current, saved)}"
        # a small bundle goes through the command pipe: no file to create and remove per cell
        path = self._write_bundle(job) if len(job.bundle) > INLINE_BUNDLE_LIMIT else None
        command = (
            {"op": "run", "bundle": str(path)}
            if path is not None
            else {"op": "run", "bundle_b64": base64.b64encode(job.bundle).decode("ascii")}
        )
        stale = current.process.expect_run(job.run_id)
        run = SessionRun(current, path, self._on_death, note, stale, command, self._forget)
        run.on_ok = self._auto_checkpoint
        return run

    def _session_process(self, job: Job, nonce: str, env: Mapping[str, str]) -> RunnerProcess | NodeProcesses:
        ranks = job.request.ranks
        if ranks is None:
            return RunnerProcess(self._argv("--session"), env, nonce, greeting(nonce), interactive=True)
        from dataclasses import replace

        from .local_nodes import start_nodes

        # a distributed session: a launcher per node, greeted with the session's nonce and the shape
        return start_nodes(replace(job, nonce=nonce), ranks, env, self._argv, session=True)

    def _resume(self, session: LocalSession, saved: SavedCheckpoint) -> str:
        """A lost session's new runner gets its last checkpoint back; says what was and was not restored."""
        try:
            restored, skipped = self.checkpoints.restore(session.process, saved, target_trusted=True)
        except (OffloadUsageError, SessionLost) as exc:
            return f"its last checkpoint {saved.name} could not be restored: {exc}"
        return restored_line(saved, restored, skipped)

    def _auto_checkpoint(self, session: LocalSession) -> None:
        """After a cell that ended ok, write the session's checkpoint in the background (if it asked for it)."""
        if session.auto_limit is None or not session.process.alive:
            return
        session.busy = True

        def write() -> None:
            try:
                saved = self.checkpoints.take(session.process, session.name, session.name, session.placement,
                                              trusted=True, limit=session.auto_limit or 0)
                session.auto_note = f"automatic checkpoint after the last cell: {saved.describe()}"
            except (OffloadUsageError, SessionLost, OSError) as exc:
                session.auto_note = (f"the automatic checkpoint after the last cell was not written ({exc}); "
                                     "the one before it stays")
            finally:
                session.busy = False

        session.background = daemon_thread(write)

    def checkpoint_session(self, name: str, checkpoint: str, limit: int | None = None,
                           auto: bool | None = None) -> SavedCheckpoint:
        """Write session ``name``'s state as checkpoint ``checkpoint`` (see :mod:`.local_state`); ``auto``:
        from now on also after every cell that ends ok (``False``: no longer)."""
        waiting = self._sessions.get(name)
        if waiting is not None:
            waiting.settle()
        with self._lock:
            current = self._sessions.get(name)
            if current is None or not current.process.alive:
                raise OffloadUsageError(f"%gpu_offload checkpoint: no live session named {name!r}; "
                                        "`%gpu_offload sessions` lists them")
            if current.busy or not isinstance(current.process, RunnerProcess):
                raise OffloadUsageError(f"session {name!r} is running a cell or is distributed: checkpoint it "
                                        "between cells (a distributed session cannot be checkpointed yet)")
            current.busy = True
        try:
            saved = self.checkpoints.take(current.process, name, checkpoint, current.placement, trusted=True,
                                          limit=limit or DEFAULT_LIMIT)
            if auto is not None:
                current.auto_limit = (limit or DEFAULT_LIMIT) if auto else None
            return saved
        except SessionLost as exc:
            self._on_death(name, current.process.returncode)
            raise OffloadUsageError(f"session {name!r} was lost while checkpointing: {exc}") from None
        finally:
            current.busy = False

    def restore_session(self, checkpoint: str, session: str | None = None) -> str:
        """Start session ``session`` (default: the checkpoint's own) from checkpoint ``checkpoint``."""
        saved = self.checkpoints.get(checkpoint)
        name = session or saved.session
        with self._lock:
            current = self._sessions.get(name)
            if current is not None and current.process.alive:
                raise OffloadUsageError(f"session {name!r} is running: close it first (%gpu_offload close "
                                        f"{name}) or restore into another one (--session NEW)")
            nonce = secrets.token_hex(16)
            process = RunnerProcess(self._argv("--session"), runner_environment(saved.placement, os.environ),
                                    nonce, greeting(nonce), interactive=True)
            current = self._sessions[name] = LocalSession(name, process, saved.placement)
            current.busy = True
            self._lost.pop(name, None)
        try:
            restored, skipped = self.checkpoints.restore(process, saved, target_trusted=True)
        except BaseException:
            self.close_session(name, grace=1.0)  # nothing half-restored is left running
            raise
        finally:
            current.busy = False
        return f"session {name}: " + restored_line(saved, restored, skipped)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._sessions.pop(name, None)

    def _on_death(self, name: str, code: int | None) -> None:
        with self._lock:
            self._died(name, code)

    def _died(self, name: str, code: int | None) -> None:
        # the next cell of this session starts a new runner: say so, since the old state is gone
        self._sessions.pop(name, None)
        self._lost[name] = (
            f"session `{name}`'s runner had ended (exit code {code}); this cell starts a new one, so "
            "variables that lived only in the session are gone"
        )

    def sessions(self) -> list[SessionInfo]:
        """The warm runners that are still alive."""
        with self._lock:
            return [
                SessionInfo(s.name, f"local pid {s.process.pid}", s.runs, s.busy)
                for s in self._sessions.values()
                if s.process.alive
            ]

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        """Ask the session's runner to exit; kill it after ``grace`` seconds."""
        with self._lock:
            current = self._sessions.pop(name, None)
        if current is None:
            return False
        current.settle()
        current.process.send({"op": "exit"})
        current.process.stop(grace)
        return True

    def close(self) -> None:
        """End every session."""
        for name in list(self._sessions):
            self.close_session(name, grace=2.0)
        self.checkpoints.close()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
