"""The local backend's session checkpoints: written by the runner, recorded (manifest and sha256) by the kernel.

A checkpoint file lives in a per-user directory under the kernel's cache dir (``checkpoints/<uid>/kernel-*``,
mode 0700). The runner writes it in the format the donor's trust decides (:mod:`gpu_offload.runner.session_state`);
the kernel hashes the file itself and keeps the manifest in memory, so a file changed after it was written is
refused on restore. What the runner says about itself is not believed: whether a checkpoint may be restored
in full is the kernel's trust in the runner that wrote it, never the manifest's claim. The files last as long
as the kernel: :meth:`SessionCheckpoints.close` removes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...runner import checkpoint
from ..errors import OffloadUsageError
from .base import RunnerExit, RunRequest
from .checkpoint_book import (
    Answer,
    CheckpointBook,
    RecordedCheckpoint,
    SessionLost,
    not_restored_as_data,
    restore_answer,
    trusted_manifest,
)

EXCHANGE_TIMEOUT = 600.0
"""Seconds a checkpoint or a restore may take before the kernel gives up on it."""


@dataclass(frozen=True)
class SavedCheckpoint(RecordedCheckpoint):
    """One checkpoint this kernel recorded, in a file of its checkpoint directory."""

    path: Path


def store_dir() -> Path:
    """This kernel's checkpoint directory, inside this user's, both created private."""
    from ...runner.build import cache_dir

    user = cache_dir() / "checkpoints" / str(os.getuid())
    user.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(user, 0o700)
    directory = user / f"kernel-{os.getpid()}-{secrets.token_hex(4)}"
    directory.mkdir(mode=0o700)
    return directory


def _exchange(process: Any, command: dict[str, Any]) -> dict[str, Any]:
    """Send ``command`` to a session runner and read its answer (the ``checkpoint`` frame's payload)."""
    run_id = "ckpt-" + secrets.token_hex(8)
    process.expect_run(run_id)
    if not process.send({**command, "run_id": run_id}):
        raise SessionLost("the session's runner is gone")
    deadline = time.monotonic() + EXCHANGE_TIMEOUT
    answer = Answer(command["op"], "the session")
    while True:
        event = process.next_event(max(deadline - time.monotonic(), 0.0))
        if event is None:
            raise OffloadUsageError(f"the session did not answer {command['op']} within {EXCHANGE_TIMEOUT:.0f} s")
        if isinstance(event, RunnerExit):
            raise SessionLost(f"the session's runner ended (exit code {event.code})")
        payload = answer.take(event)
        if payload is not None:
            return payload


class SessionCheckpoints(CheckpointBook[SavedCheckpoint]):
    """The checkpoints of this kernel's local sessions, by name, and the last one of each session."""

    def __init__(self) -> None:
        super().__init__()
        self._directory: Path | None = None

    def take(self, process: Any, session: str, name: str, placement: RunRequest, *, trusted: bool,
             limit: int = checkpoint.DEFAULT_LIMIT) -> SavedCheckpoint:
        """Have the session's runner write its state; record it under ``name`` (replacing an older one)."""
        if self._directory is None:
            self._directory = store_dir()
        path = self._directory / f"{secrets.token_hex(12)}.ckpt"
        try:
            answer = _exchange(process, {"op": "checkpoint", "path": str(path), "limit": limit,
                                         "format": None if trusted else checkpoint.SAFE})
            manifest = dict(answer["manifest"])
            data = path.read_bytes()
        except BaseException:
            _unlink(path)
            raise
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest.get("sha256") or manifest.get("format") not in checkpoint.FORMATS:
            _unlink(path)
            raise OffloadUsageError("the session's runner wrote a checkpoint that does not match its manifest; "
                                    "nothing was recorded")
        trusted = trusted_manifest(manifest, trusted, limit)
        saved = SavedCheckpoint(name, session, manifest, placement, trusted, path=path)
        old = self.record(saved)
        if old is not None and old.path != path:
            _unlink(old.path)
        return saved

    def restore(self, process: Any, saved: SavedCheckpoint, *,
                target_trusted: bool) -> tuple[list[str], dict[str, str]]:
        """Put ``saved`` into a fresh session runner; returns the names restored and those that were not.

        A trusted checkpoint is unpickled by the runner (a trusted one only). An untrusted one is never
        unpickled: the kernel decodes its data with the safe decoder and sends the values as a checkpoint of
        its own making, as it sends a cell's inputs.
        """
        if saved.trusted and not target_trusted:
            raise OffloadUsageError(f"checkpoint {saved.name} is restored in full only onto a trusted donor; "
                                    "restore it with --trusted-only")
        path, manifest, dropped = saved.path, saved.manifest, dict[str, str]()
        if not saved.trusted:
            path, manifest, dropped = self._as_data(saved)
        try:
            answer = _exchange(process, {"op": "restore", "path": str(path), "manifest": manifest})
        finally:
            if path != saved.path:
                _unlink(path)
        return restore_answer(answer, dropped)

    def _as_data(self, saved: SavedCheckpoint) -> tuple[Path, dict[str, Any], dict[str, str]]:
        from ..trust.decode import SafeDecodeError, decode

        data = saved.path.read_bytes()
        checkpoint.verify(data, saved.manifest)
        try:
            decoded = decode(data)
        except SafeDecodeError as exc:
            raise OffloadUsageError(f"checkpoint {saved.name} cannot be read as data: {exc}") from None
        dropped = not_restored_as_data(decoded.skipped, saved.manifest)
        ours = checkpoint.take(decoded.values, checkpoint.PICKLE, trusted=True, written_on="the kernel")
        assert self._directory is not None
        path = self._directory / f"{secrets.token_hex(12)}.data"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(ours.data)
        return path, ours.manifest, dropped

    def close(self) -> None:
        """Remove every checkpoint file of this kernel."""
        for saved in self.saved.values():
            _unlink(saved.path)
        self.forget_all()
        if self._directory is not None:
            for directory in (self._directory, self._directory.parent, self._directory.parent.parent):
                with contextlib.suppress(OSError):
                    directory.rmdir()  # the user's only when empty: another kernel of this user may have its own


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


__all__ = ["SavedCheckpoint", "SessionCheckpoints", "store_dir"]
