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
from ..base import Placed, Ranks, RunRequest
from ..checkpoint_book import SessionLost
from . import rank_checkpoints as rank_ckpt
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
    rank_objs: tuple[str, ...] = ()
    """A distributed session's: rank r's state is object ``rank_objs[r]`` (its manifest ``manifest["ranks"][r]``,
    see :mod:`.rank_checkpoints`) and ``obj`` is unused; empty for a single session's."""

    @property
    def written_on(self) -> str:
        return self.cluster

    @property
    def objects(self) -> tuple[str, ...]:
        """Every object of the checkpoint in storage."""
        return self.rank_objs or (self.obj,)


def ranks_of(holder: Any) -> Ranks | None:
    """The shape of a distributed session (its pods run one launcher each); ``None`` for a single session."""
    return getattr(holder, "ranks", None)


def wait_running(holder: Holder, timeout: float = START_TIMEOUT) -> float:
    """Wait until the holder's runner (every pod's, for a distributed session) runs; returns the seconds waited.
    :class:`SessionLost` if it ended first."""
    if ranks_of(holder) is not None:
        return rank_ckpt.wait_nodes_running(holder, timeout)  # type: ignore[arg-type]
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
    world: int = 0
    """A distributed session's number of ranks: rank r writes ``obj.r<r>`` and ``obj.r<r>.m``."""

    def objects(self) -> list[tuple[str, str]]:
        """Where each rank writes its state and its manifest (one pair for a single session)."""
        if not self.world:
            return [(self.obj, self.obj + ".m")]
        return [(f"{self.obj}.r{r}", f"{self.obj}.r{r}.m") for r in range(self.world)]


class KubeCheckpoints(book.CheckpointBook[KubeCheckpoint]):
    """The checkpoints of this kernel's sessions on the cluster, by name, and the last one of each session."""

    def __init__(self, storage: RunStorage) -> None:
        super().__init__()
        self.storage = storage
        self.folder = f"ckpt-{secrets.token_hex(8)}"

    def take(self, holder: Holder, name: str, placement: RunRequest, *, trusted: bool, limit: int,
             only_if_changed: bool = False) -> KubeCheckpoint | None:
        """Have the session's runner (every rank, for a distributed session) upload its state as checkpoint
        ``name`` (replacing an older one of that name); ``only_if_changed``: return ``None`` without uploading
        when the state is the last checkpoint's."""
        if ranks_of(holder) is not None:
            return self._take_ranks(holder, name, placement, trusted=trusted, limit=limit,
                                    only_if_changed=only_if_changed)
        obj = secrets.token_hex(12)
        before = self.saved.get(name)
        command: dict[str, Any] = {"op": "checkpoint", "put_url": self.storage.put_url(self.folder, obj),
                                   **self._common(holder, limit, trusted)}
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
        return self._replace(before, KubeCheckpoint(name, holder.name, manifest, placement, trusted,
                                                    folder=self.folder, obj=obj, cluster=holder.cluster))

    @staticmethod
    def _common(holder: Holder, limit: int, trusted: bool) -> dict[str, Any]:
        return {"limit": limit, "format": None if trusted else checkpoint.SAFE, "where": holder.cluster}

    def _replace(self, before: KubeCheckpoint | None, saved: KubeCheckpoint) -> KubeCheckpoint:
        """Record ``saved`` in place of ``before`` and remove what of ``before`` it does not keep."""
        self.record(saved)
        for obj in set(before.objects if before is not None else ()) - set(saved.objects):
            self._remove(obj)
        return saved

    def _take_ranks(self, holder: Any, name: str, placement: RunRequest, *, trusted: bool, limit: int,
                    only_if_changed: bool) -> KubeCheckpoint | None:
        """A distributed session's checkpoint: one object per rank, one record naming all (:mod:`.rank_checkpoints`);
        a rank whose state did not change keeps its object of the last checkpoint."""
        shape: Ranks = holder.ranks
        before = self.saved.get(name)
        same = (only_if_changed and before is not None and before.session == holder.name
                and len(before.rank_objs) == shape.world_size)
        objs = [secrets.token_hex(12) for _ in range(shape.world_size)]
        parts: dict[int, dict[str, Any]] = {r: {"put_url": self.storage.put_url(self.folder, obj)}
                                            for r, obj in enumerate(objs)}
        if same:
            assert before is not None
            for rank, part in enumerate(before.manifest.get("ranks", [])):
                parts[rank]["unless_sha256"] = part.get("sha256")
        answers = rank_ckpt.exchange_ranks(holder, {"op": "checkpoint", **self._common(holder, limit, trusted)}, parts)
        manifests = {r: dict(a.get("manifest") or {}) for r, a in answers.items()}
        try:
            merged = rank_ckpt.merged_parts(manifests, before.manifest.get("ranks", []) if same and before else [],
                                            before.rank_objs if same and before else (), objs, limit)
        except OffloadUsageError:
            for obj in objs:
                self._remove(obj)
            raise
        if merged is None:
            return None
        return self._replace(before, self._ranked_record(name, holder, placement, merged, trusted, limit))

    def _ranked_record(self, name: str, holder: Any, placement: RunRequest,
                       merged: tuple[list[dict[str, Any]], list[str]], trusted: bool, limit: int) -> KubeCheckpoint:
        parts, objs = merged
        # the kernel's trust in the cluster decides, for each rank's part as for the whole
        trusted = all([book.trusted_manifest(part, trusted, limit) for part in parts])
        manifest = rank_ckpt.combine(parts, holder.ranks)
        book.trusted_manifest(manifest, trusted, limit)
        return KubeCheckpoint(name, holder.name, manifest, placement, trusted, folder=self.folder, obj="",
                              cluster=holder.cluster, rank_objs=tuple(objs))

    def arm(self, holder: Holder, saved: KubeCheckpoint, nonce: str) -> Armed:
        """Have the runner write its state at SIGTERM if it changed since ``saved`` (see :class:`Armed`); every rank
        of a distributed session writes its signed record even when its state did not change."""
        shape = ranks_of(holder)
        armed = Armed(saved, secrets.token_hex(12), nonce, shape.world_size if shape is not None else 0)
        common = {"op": "on_term",
                  **self._common(holder, saved.manifest.get("limit", checkpoint.DEFAULT_LIMIT), saved.trusted)}
        urls = [{"put_url": self.storage.put_url(self.folder, obj),
                 "manifest_url": self.storage.put_url(self.folder, manifest)} for obj, manifest in armed.objects()]
        if shape is None:
            exchange(holder, {**common, **urls[0], "unless_sha256": saved.manifest.get("sha256")})
            return armed
        before = saved.manifest.get("ranks", [])
        parts = {r: {**url, "unless_sha256": before[r].get("sha256") if r < len(before) else None}
                 for r, url in enumerate(urls)}
        ranked: Any = holder
        rank_ckpt.exchange_ranks(ranked, {**common, "always_record": True}, parts)
        return armed

    def _term_manifest(self, armed: Armed, key: str) -> dict[str, Any] | None:
        """A manifest a runner wrote at SIGTERM, if there is one signed with the session's nonce."""
        from ....runner.session_state import manifest_signature

        try:
            found = self.storage.client.get_object(Bucket=self.storage.settings.bucket,
                                                   Key=self.storage.key(self.folder, key),
                                                   Range=f"bytes=0-{MANIFEST_LIMIT - 1}")
            manifest = json.loads(found["Body"].read(MANIFEST_LIMIT))
        except Exception:  # noqa: BLE001 - none written (no SIGTERM, or no change), or unreadable: not used
            return None
        if not isinstance(manifest, dict) or not hmac.compare_digest(
                str(manifest.get("hmac", "")), manifest_signature(armed.nonce, manifest)):
            return None  # not the runner's: another writer of the bucket, or a damaged record
        return manifest

    def at_term(self, armed: Armed) -> KubeCheckpoint | None:
        """The checkpoint the runner wrote when its pod was stopped, if it wrote one and signed it (else None). A
        distributed session's is used only when every rank signed its record (its ranks' states from one moment);
        else the last checkpoint of all ranks stands."""
        if armed.world:
            return self._at_term_ranks(armed)
        manifest = self._term_manifest(armed, armed.obj + ".m")
        limit = armed.saved.manifest.get("limit", checkpoint.DEFAULT_LIMIT)
        if (manifest is None or manifest.get("format") not in checkpoint.FORMATS
                or type(manifest.get("size")) is not int or not 0 <= manifest["size"] <= limit):
            return None
        before = armed.saved
        trusted = book.trusted_manifest(manifest, before.trusted, limit)
        saved = replace(before, manifest=manifest, trusted=trusted, folder=self.folder, obj=armed.obj)
        self._replace(before, saved)
        self._remove(armed.obj + ".m")
        return saved

    def _at_term_ranks(self, armed: Armed) -> KubeCheckpoint | None:
        before, limit = armed.saved, armed.saved.manifest.get("limit", checkpoint.DEFAULT_LIMIT)
        answers: dict[int, dict[str, Any]] = {}
        for rank, (_obj, key) in enumerate(armed.objects()):
            manifest = self._term_manifest(armed, key)
            if manifest is None:
                return None
            answers[rank] = {k: v for k, v in manifest.items() if k not in ("hmac", "at_term")}
        try:
            merged = rank_ckpt.merged_parts(answers, before.manifest.get("ranks", []), before.rank_objs,
                                            [obj for obj, _ in armed.objects()], limit)
        except OffloadUsageError:
            return None  # a record the kernel does not accept: the last checkpoint stands
        if merged is None:
            return None  # no rank changed since the last checkpoint: it is the state
        parts, objs = merged
        trusted = all([book.trusted_manifest(part, before.trusted, limit) for part in parts])
        manifest = rank_ckpt.combine(parts, before.placement.ranks or Ranks(len(parts), 1))
        book.trusted_manifest(manifest, trusted, limit)
        saved = self._replace(before, replace(before, manifest=manifest, trusted=trusted, rank_objs=tuple(objs)))
        for _obj, key in armed.objects():
            self._remove(key)
        return saved

    def restore(self, holder: Holder, saved: KubeCheckpoint, *,
                target_trusted: bool) -> tuple[list[str], dict[str, str]]:
        """Put ``saved`` into the holder's fresh runner (rank r's state into rank r of a distributed session of
        the same shape); returns the names restored and those that were not."""
        refusal = rank_ckpt.shape_refusal(saved.name, saved.placement.ranks, ranks_of(holder), holder.name)
        if refusal is not None:
            raise OffloadUsageError(refusal)
        if saved.trusted and not target_trusted:
            raise OffloadUsageError(f"checkpoint {saved.name} was written on a trusted cluster and is restored in "
                                    f"full only onto a trusted one, and {holder.cluster} is not; run the session "
                                    "with --trusted-only")
        if saved.rank_objs:
            return self._restore_ranks(holder, saved)
        obj, manifest, dropped = saved.obj, saved.manifest, dict[str, str]()
        if not saved.trusted:
            obj, manifest, dropped = self._as_data(saved.name, saved.obj, saved.manifest)
        try:
            answer = exchange(holder, {"op": "restore", "get_url": self.storage.get_url(self.folder, obj),
                                       "manifest": manifest, "as_data": obj != saved.obj})
        finally:
            if obj != saved.obj:
                self._remove(obj)
        return book.restore_answer(answer, dropped)

    def _restore_ranks(self, holder: Any, saved: KubeCheckpoint) -> tuple[list[str], dict[str, str]]:
        """Each rank's state into the same rank; an untrusted checkpoint's read as data per rank, by the kernel."""
        parts: dict[int, dict[str, Any]] = {}
        dropped: dict[int, dict[str, str]] = {}
        ours: list[str] = []
        try:
            for rank, (obj, manifest) in enumerate(zip(saved.rank_objs, saved.manifest["ranks"], strict=True)):
                dropped[rank] = {}
                if not saved.trusted:
                    obj, manifest, dropped[rank] = self._as_data(f"{saved.name} (rank {rank})", obj, manifest)
                    ours.append(obj)
                parts[rank] = {"get_url": self.storage.get_url(self.folder, obj), "manifest": manifest,
                               "as_data": not saved.trusted}
            answers = rank_ckpt.exchange_ranks(holder, {"op": "restore"}, parts)
        finally:
            for obj in ours:
                self._remove(obj)
        return rank_ckpt.restored_words({r: book.restore_answer(answers[r], dropped[r]) for r in answers})

    def _as_data(self, name: str, obj: str, manifest: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, str]]:
        """An untrusted checkpoint's object read as data only, and pickled again by this kernel for the new
        runner."""
        from ...trust.decode import SafeDecodeError, decode

        try:  # bounded by the size recorded, refused if its bytes changed since
            data = self.storage.read(self.folder, obj, manifest.get("sha256"), manifest.get("size"))
            decoded = decode(data)
        except (StorageError, SafeDecodeError) as exc:
            raise OffloadUsageError(f"checkpoint {name} cannot be read as data: {exc}") from None
        dropped = book.not_restored_as_data(decoded.skipped, manifest)
        written = checkpoint.take(decoded.values, checkpoint.PICKLE, trusted=True, written_on="the kernel")
        ours = secrets.token_hex(12)
        self.storage.upload(self.folder, ours, written.data)
        return ours, written.manifest, dropped

    def drop(self, armed: Armed) -> None:
        """Remove what an armed checkpoint may have written (it will not be used)."""
        for obj, manifest in armed.objects():
            self._remove(obj)
            self._remove(manifest)

    def _remove(self, obj: str) -> None:
        with contextlib.suppress(Exception):  # left to the bucket's lifecycle rule
            self.storage.client.delete_object(Bucket=self.storage.settings.bucket,
                                              Key=self.storage.key(self.folder, obj))

    def close(self) -> None:
        """Remove every checkpoint object of this kernel."""
        self.storage.remove_run(self.folder)
        self.forget_all()
