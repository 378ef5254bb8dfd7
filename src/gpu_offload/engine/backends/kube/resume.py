"""Sessions on the cluster that outlive their pods: checkpoints after each changed cell, before an idle
release and on request; the next cell after a loss resumes from the last one.

The backend calls four hooks: :meth:`SessionKeeper.after_cell` when a cell of a session ended (a checkpoint in
the background, only uploaded when the state changed, then the idle timer), :meth:`~SessionKeeper.settle`
before a session takes its next cell (the runner answers one command at a time),
:meth:`~SessionKeeper.before_release` when the idle timer ends a session, and :meth:`~SessionKeeper.resume`
when a cell starts a session anew (the old pod was preempted, drained, lost or released): the new runner gets
the last checkpoint back and the cell says what happened, how long the wait and the restore took, and what was
and was not restored. Without object storage nothing is checkpointed and sessions behave as before.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ....liqo_peering.untrusted_text import shown
from ....liqo_peering.wording import duration
from ....runner.checkpoint import DEFAULT_LIMIT
from ...errors import OffloadUsageError
from ..base import RunRequest
from ..checkpoint_book import SessionLost, restored_line
from .checkpoints import Armed, KubeCheckpoint, KubeCheckpoints, wait_running
from .idle import HUB, IdleTimeout
from .restore_estimate import CHECKPOINT, RESTORE, Pace, estimate, size_words
from .storage import RunStorage, StorageError


@dataclass(frozen=True)
class IdleEnded:
    """A session this kernel ended for idling: its pod, how it ended (said to its next cell), what it asked."""

    holder: str
    how: str
    request: RunRequest


def resume_key(request: RunRequest) -> tuple[RunRequest, tuple[int, int] | None]:
    """What the cell resuming an ended session must ask as the session did: its shape and options, not where
    it ran (the old cluster may be gone; ``%gpu_offload move`` changes the same two)."""
    return replace(request, cluster="auto", gpu_model=None, fallback_models=()).session_key()


def resume_differences(was: RunRequest, now: RunRequest) -> str:
    """The options in which ``now`` differs from the session's ``was``, e.g. ``gpus 4 (this cell: 1)``."""
    (old, old_ranks), (new, new_ranks) = resume_key(was), resume_key(now)
    words = [f"{f.name} {getattr(old, f.name)!r} (this cell: {getattr(new, f.name)!r})"
             for f in fields(old) if getattr(old, f.name) != getattr(new, f.name)]
    if old_ranks != new_ranks:
        words.append(f"nodes x processes {old_ranks} (this cell: {new_ranks})")
    return "; ".join(words)


NO_STORAGE = "this kernel has no object storage to checkpoint to"


def why_not_kept(request: RunRequest, storage: bool) -> str | None:
    """Why a session of ``request`` does not outlive its pod, or ``None`` when it does: it is then checkpointed
    after each cell that changed it, when its pod is told to stop and before an idle release, and the next cell
    after its pod ended (preempted, drained, lost, released) restores the last checkpoint. ``storage``: the
    kernel has object storage. A distributed session is kept too: each rank's state, restored into the same
    rank of a session of the same shape. The one rule :class:`SessionKeeper` follows; the trace replay
    (``bench/bench_sessions_replay.py``) asks it too."""
    if not storage:
        return NO_STORAGE
    return None


@dataclass(frozen=True)
class Released:
    """A session whose pod this kernel gave back while idle: since when, and how many GPUs."""

    since: float
    gpus: int


class SessionKeeper:
    """Checkpoints and resumes of one backend's sessions (a no-op without object storage)."""

    def __init__(self, storage: RunStorage | None, trusts: Callable[[str], bool],
                 idle_timeout: Callable[[str], IdleTimeout] = lambda _name: IdleTimeout(0.0, HUB)) -> None:
        self.idle_timeout = idle_timeout
        """A session's idle timeout (told to the user with its first checkpoint); 0 seconds: never released."""
        self.checkpoints = KubeCheckpoints(storage) if storage is not None else None
        self.trusts = trusts
        self.auto: dict[str, int | None] = {}
        """Session -> the limit of its automatic checkpoints (``None``: turned off); unset: on, default limit."""
        self._locks: dict[str, threading.Lock] = {}
        self._notes: dict[str, tuple[str, bool]] = {}
        """What the next cell of a session is told: (text, whether it is a warning)."""
        self._told: set[str] = set()
        self._moved: dict[str, RunRequest] = {}
        self._released: dict[str, Released] = {}
        self._armed: dict[str, Armed] = {}
        """Session -> the checkpoint its runner writes at SIGTERM if its state changed since the last one."""
        self.gpu_seconds_returned = 0.0
        """GPU-seconds this kernel's sessions gave back to the pool while released for idling."""
        self.pace = Pace()
        """This kernel's timed restores and checkpoints: what a restore's estimate rests on."""

    def _why_not(self, request: RunRequest) -> str | None:
        return why_not_kept(request, self.checkpoints is not None)

    # --- ordering: one checkpoint or cell at a time per session ---

    def _lock(self, name: str) -> threading.Lock:
        return self._locks.setdefault(name, threading.Lock())

    def settle(self, name: str) -> None:
        """Wait for a checkpoint of session ``name`` still being written."""
        with self._lock(name):
            pass

    # --- after a cell ---

    def after_cell(self, session: Any, then: Callable[[Any], None]) -> None:
        """A cell of ``session`` ended: checkpoint it in the background if its state changed, then ``then``."""
        limit = self.auto.get(session.name, DEFAULT_LIMIT)
        if limit is None or self._why_not(session.request) is not None:
            then(session)
            return
        lock = self._lock(session.name)
        lock.acquire()  # taken here, so a cell that comes at once waits for this checkpoint

        def write() -> None:
            try:
                self._note(session, self._take(session, session.name, limit, only_if_changed=True), limit)
            except (OffloadUsageError, SessionLost, StorageError) as exc:
                self._notes[session.name] = (f"the automatic checkpoint after the last cell was not written ({exc}); "
                                             "the one before it stays", True)
            finally:
                lock.release()
            then(session)

        threading.Thread(target=write, name=f"gpu-offload-checkpoint-{session.name}", daemon=True).start()

    def _note(self, session: Any, saved: KubeCheckpoint | None, limit: int) -> None:
        if saved is not None and session.name not in self._told:
            self._told.add(session.name)
            self._notes[session.name] = (
                f"session {session.name} is checkpointed after each cell that changes it, to your storage (limit "
                f"{limit / 2**20:.0f} MiB; `%gpu_offload checkpoint {session.name} --auto off` stops it): "
                f"{saved.describe()}{self._release_words(session.name)}", False)

    def _release_words(self, name: str) -> str:
        timeout = self.idle_timeout(name)
        if timeout.seconds <= 0:
            return ""
        return (f". Idle for {duration(timeout.seconds, 'min')} ({timeout.source}), its pod is released "
                "and the GPUs go back to the pool; the next cell resumes it from the checkpoint")

    def note(self, name: str) -> tuple[str, bool] | None:
        """What the last automatic checkpoint of session ``name`` has to tell its next cell, once, and whether it
        is a warning (a checkpoint not written) or a quiet notice (the first one written, and what it holds)."""
        return self._notes.pop(name, None)

    def _take(self, session: Any, name: str, limit: int, only_if_changed: bool = False) -> KubeCheckpoint | None:
        assert self.checkpoints is not None
        started = time.monotonic()
        saved = self.checkpoints.take(session, name, session.request, trusted=self.trusts(session.cluster),
                                      limit=limit, only_if_changed=only_if_changed)
        if saved is not None:
            self.pace.add(CHECKPOINT, saved.manifest.get("size"), time.monotonic() - started)
        if saved is not None and name == session.name:
            session.resumes_from = name
            self._arm(session, saved)
        return saved

    def _arm(self, session: Any, saved: KubeCheckpoint) -> None:
        assert self.checkpoints is not None
        old = self._armed.pop(session.name, None)
        if old is not None:
            self.checkpoints.drop(old)
        nonce = getattr(getattr(session, "order", None), "nonce", None)
        if nonce:
            self._armed[session.name] = self.checkpoints.arm(session, saved, nonce)

    # --- on request ---

    def take(self, session: Any, name: str, limit: int | None, auto: bool | None) -> KubeCheckpoint:
        """``%gpu_offload checkpoint``: write session's state as ``name`` now; ``auto`` turns the automatic ones
        on or off."""
        store = self.store()
        with self._lock(session.name):
            saved = self._take(session, name, limit or DEFAULT_LIMIT)
        if auto is not None:
            self.auto[session.name] = (limit or DEFAULT_LIMIT) if auto else None
        assert saved is not None and store is not None
        return saved

    def take_if_changed(self, session: Any) -> KubeCheckpoint:
        """The session's own checkpoint (named after it), written now only if its state changed since the last
        one (a drain's move: an idle session was checkpointed after its last cell)."""
        store = self.store()
        with self._lock(session.name):
            saved = self._take(session, session.name, self.auto.get(session.name) or DEFAULT_LIMIT,
                               only_if_changed=True)
        saved = saved or store.latest(session.name)
        assert saved is not None, "an unchanged state has a checkpoint it was compared with"
        return saved

    def store(self) -> KubeCheckpoints:
        if self.checkpoints is None:
            raise OffloadUsageError("sessions on the cluster are checkpointed to object storage, and this kernel "
                                    "has none: ask your JupyterHub admin to set the chart's storage "
                                    "(GPU_OFFLOAD_S3_BUCKET)")
        return self.checkpoints

    # --- idle release ---

    def before_release(self, session: Any) -> str:
        """The idle timer ends ``session``: checkpoint it first (if it changed); the words for the next cell."""
        if self.checkpoints is None or self._why_not(session.request) is not None:
            return ""
        with self._lock(session.name):
            try:
                saved = self._take(session, session.name, self.auto.get(session.name) or DEFAULT_LIMIT,
                                   only_if_changed=True)
            except (OffloadUsageError, SessionLost, StorageError) as exc:
                return f"; its state could not be checkpointed ({exc})"
        saved = saved or self.checkpoints.latest(session.name)
        return "" if saved is None else f"; its state was checkpointed first ({saved.name}, {saved.manifest.get('size', 0) / 2**20:.1f} MiB)"

    def released(self, name: str, gpus: int) -> None:
        """Session ``name``'s pod was given back: its GPUs count as returned until a cell takes it again."""
        self._released[name] = Released(time.monotonic(), gpus)

    def next_cell(self, name: str) -> str:
        """What the next cell of session ``name``, whose pod is gone, will find (for ``%gpu_offload status``)."""
        saved = None if self.checkpoints is None else self.checkpoints.latest(name)
        if saved is None:
            return "its variables are gone"
        return f"its next cell resumes it from checkpoint {saved.name} ({', '.join(saved.manifest.get('saved', []))})"

    def resume_words(self, name: str, was: RunRequest) -> str:
        """What a cell with the session's options does to session ``name``, ended on its own (for a refusal that
        asks for them): resume it from its checkpoint, or start it again empty, saying why nothing was kept."""
        why = self._why_not(was)
        saved = None if self.checkpoints is None else self.checkpoints.latest(name)
        holder = "pod" if was.ranks is None else "Job"
        if saved is None:
            why = why or "no checkpoint of it was written"
            return f"start the session again in a new {holder}, empty: {why}, so its variables are gone"
        return f"resume the session from its last checkpoint {saved.name} (it may land on another cluster)"

    def returned(self) -> float:
        """GPU-hours given back so far, released sessions not yet re-acquired counted up to now."""
        now = time.monotonic()
        open_ = sum(r.gpus * (now - r.since) for r in self._released.values())
        return (self.gpu_seconds_returned + open_) / 3600

    # --- moves ---

    def moved(self, name: str, original: RunRequest) -> None:
        """Session ``name`` was moved by ``%gpu_offload move``: cells that ask for its first placement still fit."""
        self._moved[name] = original

    def fits(self, name: str, placement: RunRequest) -> bool:
        original = self._moved.get(name)
        return original is not None and original.session_key() == placement.session_key()

    # --- resume ---

    def resume(self, session: Any) -> PendingRestore | None:
        """A fresh session whose predecessor is gone (preempted, drained, lost, released): the restore of its last
        checkpoint its cell does once the new pod runs (:class:`PendingRestore`), ``None`` when there is nothing
        to restore."""
        if (self.checkpoints is None or session.runs or self._why_not(session.request) is not None
                or not session.replaces):
            return None  # a session the user closed starts afresh
        armed = self._armed.pop(session.name, None)
        at_term = self.checkpoints.at_term(armed) if armed is not None else None
        if armed is not None and at_term is None:
            self.checkpoints.drop(armed)
        saved = self.checkpoints.latest(session.name)
        if saved is None:
            return None
        before = f"its {session.replaces} {session.ended}; "
        if at_term is not None:
            before += "its runner wrote a checkpoint as the pod was stopped (SIGTERM); "
        session.replaces = ""  # the restore's notes say it instead, with what came back
        return PendingRestore(self, session, saved, before)

    def expected(self, saved: KubeCheckpoint) -> str:
        """``checkpoint train (12.3 MiB) ...; it should take about 4 s ...``: what restoring ``saved`` should take,
        from this kernel's own timed restores and checkpoints (:mod:`.restore_estimate`)."""
        size = saved.manifest.get("size")
        size = size if type(size) is int and size >= 0 else 0
        guess = estimate(size, self.pace.of(RESTORE), self.pace.of(CHECKPOINT), imports_of(saved.manifest))
        return f"checkpoint {saved.name} ({size_words(size)}) once the new pod runs; {guess.text()}"

    def restore(self, session: Any, saved: KubeCheckpoint, since: float | None = None) -> str:
        """Put ``saved`` into ``session``'s new runner once it runs; what was restored, the wait and its time.
        ``since``: when the wait for the pod started (the cell's submission), if before this call."""
        assert self.checkpoints is not None
        released = self._released.pop(session.name, None)
        if released is not None:
            self.gpu_seconds_returned += released.gpus * (time.monotonic() - released.since)
        with self._lock(session.name):
            waited = wait_running(session)
            started = time.monotonic()
            if since is not None:  # the cell restores once the pod runs: its wait began with the cell
                waited = started - since
            restored, skipped = self.checkpoints.restore(session, saved, target_trusted=self.trusts(session.cluster))
            if saved.session == session.name:
                session.resumes_from = saved.name
                self._arm(session, saved)
        took = time.monotonic() - started
        self.pace.add(RESTORE, saved.manifest.get("size"), took)  # the time said below is the one estimated
        return (f"resumed on {session.cluster} (waited {waited:.1f} s for the pod, the restore took {took:.1f} s); "
                f"{restored_line(saved, restored, skipped)}")

    def forget(self, name: str) -> None:
        """Session ``name`` was closed by the user: its released time ends, a move's first placement is forgotten."""
        self._moved.pop(name, None)
        released = self._released.pop(name, None)
        if released is not None:
            self.gpu_seconds_returned += released.gpus * (time.monotonic() - released.since)

    def close(self) -> None:
        """Kernel exit: remove every checkpoint object."""
        for name in list(self._released):
            self.forget(name)
        if self.checkpoints is not None:
            self.checkpoints.close()


IMPORTS_SHOWN = 5
"""Modules named at most where a restore's estimate says what it does not count."""


def imports_of(manifest: dict[str, Any]) -> list[str]:
    """The packages outside the standard library whose modules the checkpoint's state holds (``np`` -> numpy),
    which a fresh runner imports before it restores; the manifest is the runner's word, so shown bounded."""
    modules = manifest.get("modules")
    if not isinstance(modules, dict):
        return []
    tops = {str(m).split(".", 1)[0] for m in modules.values() if isinstance(m, str)}
    return [shown(t, 40) for t in sorted(tops - set(sys.stdlib_module_names))][:IMPORTS_SHOWN]


@dataclass
class PendingRestore:
    """The restore a resuming session's cell does before the cell itself, once the new pod runs: the cell first
    says what it restores and how long that should take (:meth:`announce`), then restores (:meth:`run`), so a
    wait in the queue or for the pod is shown meanwhile, as for any cell."""

    keeper: SessionKeeper
    session: Any
    saved: KubeCheckpoint
    before: str
    """How the old session ended, for the restore's words."""
    since: float = field(default_factory=time.monotonic)
    """When the cell that restores was submitted: the wait for the pod is counted from here."""

    def announce(self) -> str:
        """``session train: its pod ... was lost ...; restoring checkpoint train (12.3 MiB) once the new pod runs; it
        should take about 4 s ...``."""
        return f"session {self.session.name}: {self.before}restoring {self.keeper.expected(self.saved)}"

    def run(self) -> str:
        """Restore; what the cell says of it (what came back, the wait and the time, or why nothing did)."""
        name = self.session.name
        try:
            return f"session {name}: {self.before}{self.keeper.restore(self.session, self.saved, self.since)}"
        except (OffloadUsageError, SessionLost, StorageError) as exc:
            return (f"session {name}: {self.before}its last checkpoint {self.saved.name} could not be restored "
                    f"({exc}); the variables of the old session are gone, run the cells that define them again")
