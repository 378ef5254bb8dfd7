"""Session checkpoints on the kubernetes backend: written by the session's runner to the user's storage prefix.

The runner uploads its state to a presigned PUT URL of this user's prefix (it holds no credentials) and answers
with the manifest (format, names saved and not, size, sha256); the kernel keeps the manifest in memory. The
format is the one the donor's trust decides (:mod:`gpu_offload.runner.session_state`), and whether a checkpoint
may ever be unpickled is the kernel's trust in the cluster that wrote it, never the manifest's word:

- trusted cluster: the new runner downloads it by a presigned GET URL and unpickles it, after checking the
  sha256 the kernel recorded; only a runner on a trusted cluster is sent it;
- untrusted cluster: the kernel reads it (bounded by the recorded size, sha256 checked) and decodes it with the
  safe decoder, and the new runner gets the values as data the kernel pickled itself, as it gets a cell's inputs.

Objects live under ``<prefix>/<user>/ckpt-<random>/`` (one folder per kernel) and are removed at kernel exit;
a crashed kernel's are left to the bucket's lifecycle rule, as its runs' objects are.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ....runner import checkpoint
from ....runner.frames import Hello, Status
from ...errors import OffloadUsageError
from ...timing import Phase
from .. import checkpoint_book as book
from ..base import Placed, RunRequest
from ..checkpoint_book import SessionLost
from .follow import PodEnded
from .storage import RunStorage, StorageError

EXCHANGE_TIMEOUT = 600.0
"""Seconds a checkpoint or a restore may take once the runner runs."""
MANIFEST_LIMIT = 1 << 20
"""Bytes of a manifest written at SIGTERM that the kernel reads."""
START_TIMEOUT = 1800.0
"""Seconds a restore waits for the new pod's runner to start (a queue or an image pull may take long)."""


class Holder(Protocol):
    """What :func:`exchange` needs of a session: its pod's follower, a way to its stdin, where it runs."""

    name: str
    launched: Any

    @property
    def cluster(self) -> str: ...

    def send(self, command: dict[str, Any]) -> bool: ...


@dataclass(frozen=True)
class KubeCheckpoint(book.RecordedCheckpoint):
    """One checkpoint this kernel recorded: its object in storage and what the runner said is in it."""

    folder: str
    """The storage "run id" (this kernel's checkpoint folder) the object lives in."""
    obj: str
    cluster: str
    """The cluster that wrote it (its trust is the record's ``trusted``)."""

    @property
    def written_on(self) -> str:
        return self.cluster


def wait_running(holder: Holder, timeout: float = START_TIMEOUT) -> float:
    """Wait until the holder's runner runs; returns the seconds waited. :class:`SessionLost` if it ended first."""
    started = time.monotonic()
    follower = holder.launched.follower
    if not follower.running.wait(timeout):
        raise SessionLost(f"the session's pod {holder.launched.name} did not start within {timeout:.0f} s")
    return time.monotonic() - started


def exchange(holder: Holder, command: dict[str, Any], timeout: float = EXCHANGE_TIMEOUT) -> dict[str, Any]:
    """Send ``command`` to the session's runner and read its answer (the ``checkpoint`` frame's payload)."""
    wait_running(holder)
    follower = holder.launched.follower
    run_id = "ckpt-" + secrets.token_hex(8)
    follower.expect_run(run_id)
    if not holder.send({**command, "run_id": run_id}):
        raise SessionLost(f"could not attach to the session's pod {holder.launched.name}")
    pods: list[Any] = []
    try:
        return _answer(holder, command, timeout, pods)
    finally:
        for item in pods:  # where the pod landed and its phases are the session's next cell's to show
            follower.events.put(item)


def _answer(holder: Holder, command: dict[str, Any], timeout: float, pods: list[Any]) -> dict[str, Any]:
    follower = holder.launched.follower
    deadline = time.monotonic() + timeout
    answer = book.Answer(command["op"], f"session {holder.name}")
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise OffloadUsageError(f"session {holder.name} did not answer {command['op']} within {timeout:.0f} s")
        event = follower.next(min(left, 1.0))
        if event is None:
            if follower.ended:
                raise SessionLost(f"the session's pod {holder.launched.name} ended")
            continue
        if isinstance(event, PodEnded):
            follower.events.put(event)  # the session's next cell says how it ended
            raise SessionLost(f"the session's pod {holder.launched.name} ended: {event.state.text}")
        if isinstance(event, Hello | Status | Placed | Phase):
            pods.append(event)
            continue
        payload = answer.take(event)
        if payload is not None:
            return payload


@dataclass(frozen=True)
class Armed:
    """A checkpoint the runner writes at SIGTERM if its state changed since ``saved``: the data to ``obj``, the
    manifest to ``obj.m``, signed with the session's frame nonce (only this kernel and the runner know it)."""

    saved: KubeCheckpoint
    obj: str
    nonce: str


class KubeCheckpoints(book.CheckpointBook[KubeCheckpoint]):
    """The checkpoints of this kernel's sessions on the cluster, by name, and the last one of each session."""

    def __init__(self, storage: RunStorage) -> None:
        super().__init__()
        self.storage = storage
        self.folder = f"ckpt-{secrets.token_hex(8)}"

    def take(self, holder: Holder, name: str, placement: RunRequest, *, trusted: bool, limit: int,
             only_if_changed: bool = False) -> KubeCheckpoint | None:
        """Have the session's runner upload its state as checkpoint ``name`` (replacing an older one of that
        name); ``only_if_changed``: return ``None`` without uploading when the state is the last checkpoint's."""
        obj = secrets.token_hex(12)
        before = self.saved.get(name)
        command: dict[str, Any] = {"op": "checkpoint", "put_url": self.storage.put_url(self.folder, obj),
                                   "limit": limit, "format": None if trusted else checkpoint.SAFE,
                                   "where": holder.cluster}
        if only_if_changed and before is not None and before.session == holder.name:
            command["unless_sha256"] = before.manifest.get("sha256")
        answer = exchange(holder, command)
        manifest = dict(answer.get("manifest") or {})
        if manifest.get("unchanged") and before is not None:
            return None
        size = manifest.get("size")
        if (manifest.get("format") not in checkpoint.FORMATS or type(size) is not int or not 0 <= size <= limit
                or not isinstance(manifest.get("sha256"), str)):
            self._remove(obj)
            raise OffloadUsageError(f"session {holder.name}'s runner answered with a checkpoint record this kernel "
                                    "does not accept (format, size within the limit, sha256); nothing was recorded")
        trusted = book.trusted_manifest(manifest, trusted, limit)
        saved = KubeCheckpoint(name, holder.name, manifest, placement, trusted, folder=self.folder, obj=obj,
                               cluster=holder.cluster)
        self.record(saved)
        if before is not None:
            self._remove(before.obj)
        return saved

    def arm(self, holder: Holder, saved: KubeCheckpoint, nonce: str) -> Armed:
        """Have the runner write its state at SIGTERM if it changed since ``saved`` (see :class:`Armed`)."""
        armed = Armed(saved, secrets.token_hex(12), nonce)
        exchange(holder, {"op": "on_term", "put_url": self.storage.put_url(self.folder, armed.obj),
                          "manifest_url": self.storage.put_url(self.folder, armed.obj + ".m"),
                          "limit": saved.manifest.get("limit", checkpoint.DEFAULT_LIMIT),
                          "format": None if saved.trusted else checkpoint.SAFE, "where": holder.cluster,
                          "unless_sha256": saved.manifest.get("sha256")})
        return armed

    def at_term(self, armed: Armed) -> KubeCheckpoint | None:
        """The checkpoint the runner wrote when its pod was stopped, if it wrote one and signed it (else None)."""
        from ....runner.session_state import manifest_signature

        key = self.storage.key(self.folder, armed.obj + ".m")
        try:
            found = self.storage.client.get_object(Bucket=self.storage.settings.bucket, Key=key,
                                                   Range=f"bytes=0-{MANIFEST_LIMIT - 1}")
            manifest = json.loads(found["Body"].read(MANIFEST_LIMIT))
        except Exception:  # noqa: BLE001 - none written (no SIGTERM, or no change), or unreadable: not used
            return None
        limit = armed.saved.manifest.get("limit", checkpoint.DEFAULT_LIMIT)
        if (not isinstance(manifest, dict) or not hmac.compare_digest(
                str(manifest.get("hmac", "")), manifest_signature(armed.nonce, manifest))
                or manifest.get("format") not in checkpoint.FORMATS or type(manifest.get("size")) is not int
                or not 0 <= manifest["size"] <= limit):
            return None  # not the runner's: another writer of the bucket, or a damaged record
        before = armed.saved
        trusted = book.trusted_manifest(manifest, before.trusted, limit)
        saved = replace(before, manifest=manifest, trusted=trusted, folder=self.folder, obj=armed.obj)
        self.record(saved)
        self._remove(before.obj)
        self._remove(armed.obj + ".m")
        return saved

    def restore(self, holder: Holder, saved: KubeCheckpoint, *,
                target_trusted: bool) -> tuple[list[str], dict[str, str]]:
        """Put ``saved`` into the holder's fresh runner; returns the names restored and those that were not."""
        if saved.trusted and not target_trusted:
            raise OffloadUsageError(f"checkpoint {saved.name} was written on a trusted cluster and is restored in "
                                    f"full only onto a trusted one, and {holder.cluster} is not; run the session "
                                    "with --trusted-only")
        obj, manifest, dropped = saved.obj, saved.manifest, dict[str, str]()
        if not saved.trusted:
            obj, manifest, dropped = self._as_data(saved)
        try:
            answer = exchange(holder, {"op": "restore", "get_url": self.storage.get_url(self.folder, obj),
                                       "manifest": manifest, "as_data": obj != saved.obj})
        finally:
            if obj != saved.obj:
                self._remove(obj)
        return book.restore_answer(answer, dropped)

    def _as_data(self, saved: KubeCheckpoint) -> tuple[str, dict[str, Any], dict[str, str]]:
        """An untrusted checkpoint read as data only, and pickled again by this kernel for the new runner."""
        from ...trust.decode import SafeDecodeError, decode

        try:  # bounded by the size recorded, refused if its bytes changed since
            data = self.storage.read(self.folder, saved.obj, saved.manifest.get("sha256"), saved.manifest.get("size"))
            decoded = decode(data)
        except (StorageError, SafeDecodeError) as exc:
            raise OffloadUsageError(f"checkpoint {saved.name} cannot be read as data: {exc}") from None
        dropped = book.not_restored_as_data(decoded.skipped, saved.manifest)
        ours = checkpoint.take(decoded.values, checkpoint.PICKLE, trusted=True, written_on="the kernel")
        obj = secrets.token_hex(12)
        self.storage.upload(self.folder, obj, ours.data)
        return obj, ours.manifest, dropped

    def drop(self, armed: Armed) -> None:
        """Remove what an armed checkpoint may have written (it will not be used)."""
        self._remove(armed.obj)
        self._remove(armed.obj + ".m")

    def _remove(self, obj: str) -> None:
        with contextlib.suppress(Exception):  # left to the bucket's lifecycle rule
            self.storage.client.delete_object(Bucket=self.storage.settings.bucket,
                                              Key=self.storage.key(self.folder, obj))

    def close(self) -> None:
        """Remove every checkpoint object of this kernel."""
        self.storage.remove_run(self.folder)
        self.forget_all()
