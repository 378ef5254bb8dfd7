"""A session runner's ``checkpoint`` and ``restore`` commands: its namespace written out and read back.

``{"op": "checkpoint", "run_id": R, "path": P, "limit": N}`` writes the namespace with
:func:`.checkpoint.take` to the file ``P`` (a new file, readable by this user only) in the format the donor's
trust decides: the safe format where the runner sends its outputs safely (:func:`.outputs.wants_safe`: the pod
was placed on a cluster the origin does not trust), else a pickle. It answers with a ``checkpoint`` frame (the
manifest) and ``done``. ``{"op": "restore", "run_id": R, "path": P, "manifest": M}`` puts a trusted
checkpoint's state back into the namespace, and is refused on a runner that sends its outputs safely: a full
restore unpickles, which only a trusted donor may do. Both are framed like a run (``R`` is their run id), so
the engine reads their answer like a cell's.

``{"op": "on_term", "put_url": U, "manifest_url": M, "limit": N, "unless_sha256": H}`` arms a checkpoint for
when the pod is told to stop (SIGTERM: preemption, a drain, an eviction): the runner then writes its state to
``U`` if it changed since ``H`` (a cell that ran when SIGTERM came included) and its manifest to ``M``, signed
with the session's frame nonce (HMAC-SHA256), which only the kernel knows: the kernel cannot read a frame of a
pod that is going away, and another writer of the bucket cannot forge the record.

In a distributed session every rank gets the same command line from its node's launcher; what differs per rank
(its own URLs, its manifest, the sha256 of its last checkpoint) is under ``per_rank`` by global rank, and each
rank takes its own part (:func:`for_rank`). A rank's manifest names its rank. Armed with ``always_record``, a
rank writes its signed manifest at SIGTERM even when its state did not change (``unchanged``): the kernel uses a
SIGTERM checkpoint of a distributed session only when every rank said what it did, so the ranks' states come
from the same moment.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from typing import Any

from . import buffers, checkpoint
from .outputs import wants_safe
from .runtime import Runtime


def _fail(runtime: Runtime, ename: str, message: str, started: float) -> None:
    runtime.emit("error", ename=ename, evalue=message, traceback=[])
    runtime.emit("done", status="error", elapsed=round(time.perf_counter() - started, 6))


def _write_new(path: str, data: bytes) -> None:
    # O_EXCL: never write through a file (or a link) someone put there first
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def for_rank(command: dict[str, Any], rank: int | None) -> dict[str, Any]:
    """The command as rank ``rank`` must follow it: its own part of ``per_rank`` over the common fields (a
    runner outside a distributed run takes the command as it is). ``KeyError`` when the rank has no part."""
    parts = command.get("per_rank")
    if parts is None or rank is None:
        return command
    own = parts.get(str(rank)) if isinstance(parts, dict) else None
    if not isinstance(own, dict):
        raise KeyError(f"the {command.get('op')} command has no part for rank {rank}")
    return {**{k: v for k, v in command.items() if k != "per_rank"}, **own}


def take(runtime: Runtime, command: dict[str, Any]) -> None:
    """Answer a ``checkpoint`` command (see the module docstring)."""
    started = time.perf_counter()
    runtime.encoder.begin_run(str(command.get("run_id", "")))
    try:
        command = for_rank(command, runtime.rank)
        fmt = checkpoint.SAFE if wants_safe({"output_format": command.get("format")}) else checkpoint.PICKLE
        limit = int(command.get("limit", checkpoint.DEFAULT_LIMIT))
        written = _written(runtime, fmt, limit, str(command.get("where", "")))
        unchanged = bool(command.get("unless_sha256")) and command.get("unless_sha256") == written.sha256
        if unchanged:
            written.manifest["unchanged"] = True
        elif "put_url" in command:
            buffers._put(str(command["put_url"]), memoryview(written.data))
        else:
            _write_new(str(command["path"]), written.data)
    except checkpoint.CheckpointTooLarge as exc:
        _fail(runtime, "CheckpointTooLarge", str(exc), started)
    except (KeyError, TypeError, ValueError, OSError, buffers.BufferTransportError) as exc:
        _fail(runtime, "CheckpointFailed", f"the session's state could not be written: {exc}", started)
    else:
        runtime.emit("checkpoint", manifest=written.manifest)
        runtime.emit("done", status="ok", elapsed=round(time.perf_counter() - started, 6))
    runtime.encoder.end_run()


def restore(runtime: Runtime, command: dict[str, Any]) -> None:
    """Answer a ``restore`` command (see the module docstring)."""
    started = time.perf_counter()
    runtime.encoder.begin_run(str(command.get("run_id", "")))
    try:
        command = for_rank(command, runtime.rank)
        manifest = dict(command["manifest"])
        if "get_url" in command:
            data = bytes(buffers._get(str(command["get_url"]), int(manifest["size"])))
        else:
            with open(str(command["path"]), "rb") as handle:
                data = handle.read()
        # "as_data": values the kernel itself decoded from an untrusted checkpoint and pickled, like a cell's
        # inputs, which a runner anywhere takes; a checkpoint a donor wrote goes only to a trusted runner
        as_data = command.get("as_data") is True and manifest.get("written_on") == "the kernel"
        state = checkpoint.restore_trusted(data, manifest, target_trusted=as_data or not wants_safe({}))
    except checkpoint.CheckpointRefused as exc:
        _fail(runtime, "CheckpointRefused", str(exc), started)
    except Exception as exc:  # unpickling runs the checkpoint's own code: any error is the checkpoint's
        _fail(runtime, "RestoreFailed", f"the checkpoint could not be restored: {type(exc).__name__}: {exc}",
              started)
    else:
        runtime.namespace.update(state)
        runtime.emit("checkpoint", restored=sorted(state), skipped=dict(manifest.get("skipped") or {}))
        runtime.emit("done", status="ok", elapsed=round(time.perf_counter() - started, 6))
    runtime.encoder.end_run()


def _written(runtime: Runtime, fmt: str, limit: int, where: str) -> checkpoint.Checkpoint:
    written = checkpoint.take(runtime.namespace, fmt, limit, written_on=where, trusted=fmt == checkpoint.PICKLE)
    if runtime.rank is not None:
        written.manifest["rank"] = runtime.rank  # whose state it is: the kernel checks it against the frame's rank
    return written


def manifest_signature(nonce: str, manifest: dict[str, Any]) -> str:
    """The HMAC of a manifest written at SIGTERM (without its own ``hmac`` field), keyed by the frame nonce."""
    body = json.dumps({k: v for k, v in manifest.items() if k != "hmac"}, sort_keys=True).encode()
    return hmac.new(nonce.encode("ascii"), body, hashlib.sha256).hexdigest()


def arm(runtime: Runtime, command: dict[str, Any]) -> None:
    """Answer an ``on_term`` command: keep it for :func:`at_term`."""
    started = time.perf_counter()
    runtime.encoder.begin_run(str(command.get("run_id", "")))
    try:
        command = for_rank(command, runtime.rank)
    except KeyError as exc:
        _fail(runtime, "CheckpointFailed", str(exc), started)
    else:
        _arm(runtime, command, started)
    runtime.encoder.end_run()


def _arm(runtime: Runtime, command: dict[str, Any], started: float) -> None:
    if not isinstance(command.get("put_url"), str) or not isinstance(command.get("manifest_url"), str):
        _fail(runtime, "CheckpointFailed", "on_term needs put_url and manifest_url", started)
    else:
        runtime.term_checkpoint = dict(command)
        runtime.emit("checkpoint", armed=True)
        runtime.emit("done", status="ok", elapsed=round(time.perf_counter() - started, 6))


def at_term(runtime: Runtime) -> None:
    """The pod is stopping: write the armed checkpoint if the state changed (best effort, within the grace)."""
    command = runtime.term_checkpoint
    if not command:
        return
    try:
        fmt = checkpoint.SAFE if wants_safe({"output_format": command.get("format")}) else checkpoint.PICKLE
        written = _written(runtime, fmt, int(command.get("limit", checkpoint.DEFAULT_LIMIT)),
                           str(command.get("where", "")))
        manifest = {**written.manifest, "at_term": True}
        if written.sha256 == command.get("unless_sha256"):
            if not command.get("always_record"):
                return
            manifest["unchanged"] = True  # a distributed session's kernel needs every rank's word
        else:
            buffers._put(str(command["put_url"]), memoryview(written.data))
        manifest["hmac"] = manifest_signature(runtime.encoder.nonce, manifest)
        buffers._put(str(command["manifest_url"]), memoryview(json.dumps(manifest).encode()))
    except (checkpoint.CheckpointTooLarge, KeyError, TypeError, ValueError, OSError, buffers.BufferTransportError):
        return  # the checkpoint before stays; the kernel says the state after it is lost
