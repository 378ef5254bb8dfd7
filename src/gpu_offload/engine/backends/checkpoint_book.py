"""What every backend's session checkpoints have in common: the record, the book of them, the runner's answer.

A backend keeps its checkpoints where it can (the local backend in files, the kube backend in the user's
storage) and talks to its session's runner its own way; the rest is one rule for both: the kernel records
what the runner wrote under a name, remembers the last one of each session, believes the runner's manifest
only as far as the kernel's own trust in the runner goes, and reads an untrusted checkpoint as data only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ...liqo_peering.untrusted_text import shown
from ...runner import checkpoint
from ...runner.frames import Done, Error, UnknownFrame
from ..errors import OffloadUsageError
from .base import RunRequest


class SessionLost(RuntimeError):
    """The session's runner (its process or pod) ended, or never ran, while it was asked to checkpoint or restore."""


@dataclass(frozen=True)
class RecordedCheckpoint:
    """One checkpoint this kernel recorded; a backend's record adds where the checkpoint is kept."""

    name: str
    session: str
    manifest: dict[str, Any]
    placement: RunRequest
    trusted: bool
    """Whether the origin trusts the runner that wrote it: then, and only then, it may be unpickled (on a
    trusted runner)."""

    @property
    def written_on(self) -> str:
        """The cluster that wrote it, where the backend has clusters ("" otherwise)."""
        return ""

    def describe(self) -> str:
        limit = self.manifest.get("limit", checkpoint.DEFAULT_LIMIT)
        where = f", written on {self.written_on}" if self.written_on else ""
        return (f"{self.name} (session {self.session}{where}): {checkpoint.describe(self.manifest)}; "
                f"limit {limit / 2**20:.0f} MiB")


def trusted_manifest(manifest: dict[str, Any], trusted: bool, limit: int) -> bool:
    """Whether a checkpoint the runner wrote may ever be unpickled, recorded in its ``manifest`` with ``limit``:
    the kernel's trust in the runner, not the runner's word, decides (and only the pickle format unpickles)."""
    trusted = trusted and manifest.get("format") == checkpoint.PICKLE
    manifest.update(trusted=trusted, limit=limit)
    return trusted


Saved = TypeVar("Saved", bound=RecordedCheckpoint)


class CheckpointBook(Generic[Saved]):
    """The checkpoints of this kernel's sessions, by name, and the last one of each session."""

    def __init__(self) -> None:
        self.saved: dict[str, Saved] = {}
        self.last: dict[str, str] = {}

    def record(self, saved: Saved) -> Saved | None:
        """Keep ``saved`` as its name's checkpoint and its session's last; returns the one it replaced."""
        old = self.saved.get(saved.name)
        self.saved[saved.name] = saved
        self.last[saved.session] = saved.name
        return old

    def get(self, name: str) -> Saved:
        saved = self.saved.get(name)
        if saved is None:
            known = ", ".join(sorted(self.saved)) or "none yet"
            raise OffloadUsageError(f"no checkpoint named {name!r} (this kernel has: {known}); write one with "
                                    "%gpu_offload checkpoint SESSION")
        return saved

    def latest(self, session: str) -> Saved | None:
        name = self.last.get(session)
        return None if name is None else self.saved.get(name)

    def forget_all(self) -> None:
        self.saved.clear()
        self.last.clear()


class Answer:
    """A session runner's answer to one checkpoint command, read event by event: its ``checkpoint`` frame,
    any errors, then ``done``."""

    def __init__(self, op: str, session: str) -> None:
        self.op = op
        self.session = session
        """How messages name the session, e.g. ``the session`` or ``session s1``."""
        self._payload: dict[str, Any] | None = None
        self._errors: list[str] = []

    def take(self, event: Any) -> dict[str, Any] | None:
        """The answer's payload once ``event`` ends it; ``None`` while it goes on. A runner that answered with
        errors, or with nothing, is an :class:`OffloadUsageError` saying so."""
        if isinstance(event, UnknownFrame) and event.kind == "checkpoint" and isinstance(event.payload, dict):
            self._payload = event.payload
        elif isinstance(event, Error):
            self._errors.append(f"{event.ename}: {event.evalue}")
        elif isinstance(event, Done):
            if self._errors or self._payload is None:
                raise OffloadUsageError("; ".join(self._errors) or f"{self.session} answered {self.op} with nothing")
            return self._payload
        return None


def not_restored_as_data(skipped: Any, manifest: dict[str, Any]) -> dict[str, str]:
    """What an untrusted checkpoint read as data leaves behind, by name with the reason: what the safe decoder
    ``skipped``, what the writer said it did not save, and every module (an untrusted checkpoint imports
    nothing: a donor the origin does not trust does not choose what a runner imports). The writer's words are a
    donor's, so they go through ``untrusted_text.shown``."""
    dropped = {s.name: f"{s.type}: {s.reason}" for s in skipped}
    dropped.update({shown(k, 80): shown(v, 200) for k, v in dict(manifest.get("skipped") or {}).items()})
    for alias, module in dict(manifest.get("modules") or {}).items():
        dropped[shown(alias, 80)] = f"module {shown(module, 80)}: import it again (an untrusted checkpoint imports nothing)"
    return dropped


def restored_line(saved: RecordedCheckpoint, restored: list[str], skipped: dict[str, str]) -> str:
    """What the user is told after a restore."""
    text = f"restored from checkpoint {saved.name}: {', '.join(restored) or 'nothing'}"
    if skipped:
        text += "; not restored: " + "; ".join(f"{k} ({v})" for k, v in sorted(skipped.items()))
    return text


def restore_answer(answer: dict[str, Any], dropped: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The names a restore brought back, and those it did not with the reason (the runner's and ``dropped``)."""
    restored = [str(n) for n in answer.get("restored", [])]
    skipped = {str(k): str(v) for k, v in dict(answer.get("skipped") or {}).items()}
    return restored, {**skipped, **dropped}


__all__ = ["Answer", "CheckpointBook", "RecordedCheckpoint", "SessionLost", "not_restored_as_data",
           "restore_answer", "restored_line", "trusted_manifest"]
