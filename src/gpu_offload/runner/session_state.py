"""A session runner's ``checkpoint`` and ``restore`` commands: its namespace written out and read back.

``{"op": "checkpoint", "run_id": R, "path": P, "limit": N}`` writes the namespace with
:func:`.checkpoint.take` to the file ``P`` (a new file, readable by this user only) in the format the donor's
trust decides: the safe format where the runner sends its outputs safely (:func:`.outputs.wants_safe`: the pod
was placed on a cluster the origin does not trust), else a pickle. It answers with a ``checkpoint`` frame (the
manifest) and ``done``. ``{"op": "restore", "run_id": R, "path": P, "manifest": M}`` puts a trusted
checkpoint's state back into the namespace, and is refused on a runner that sends its outputs safely: a full
restore unpickles, which only a trusted donor may do. Both are framed like a run (``R`` is their run id), so
the engine reads their answer like a cell's.
"""

from __future__ import annotations

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


def take(runtime: Runtime, command: dict[str, Any]) -> None:
    """Answer a ``checkpoint`` command (see the module docstring)."""
    started = time.perf_counter()
    runtime.encoder.begin_run(str(command.get("run_id", "")))
    try:
        fmt = checkpoint.SAFE if wants_safe({"output_format": command.get("format")}) else checkpoint.PICKLE
        limit = int(command.get("limit", checkpoint.DEFAULT_LIMIT))
        written = checkpoint.take(runtime.namespace, fmt, limit, written_on=str(command.get("where", "")),
                                  trusted=fmt == checkpoint.PICKLE)
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
