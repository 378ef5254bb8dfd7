"""The warm session: JSON commands on stdin, one namespace across runs, like an ipyparallel engine.

Commands, one per line: ``{"op": "run", "bundle": PATH}`` or ``{"op": "run", "bundle_b64": ...}``,
``{"op": "interrupt"}``, ``{"op": "exit"}``, and ``checkpoint`` / ``restore`` (the namespace written out and
read back: :mod:`.session_state`). A reader thread handles ``interrupt`` at once (the main thread
is busy running the cell); runs are queued for the main thread. End of stdin ends the session.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import queue
import threading
from typing import Any

from .bundle import BundleError, parse_bundle, read_bundle
from .runtime import MISMATCH_EXIT, Runtime
from .signals import block_in_this_thread

TERMINATED_EXIT = 143


class _Commands:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()

    def read(self) -> None:
        block_in_this_thread()
        # buffered: a raw readline would make one system call per byte of a large bundle_b64 line
        with os.fdopen(self.runtime.command_fd, "rb") as source:
            for raw in iter(source.readline, b""):
                self._handle(raw)
        self.queue.put({"op": "exit"})

    def _handle(self, raw: bytes) -> None:
        try:
            command = json.loads(raw)
            op = command["op"]
        except (ValueError, TypeError, KeyError):
            self.queue.put({"op": "bad", "line": raw[:200].decode("utf-8", "replace")})
            return
        if op == "interrupt":
            self.runtime.interrupts.interrupt()
            return
        if op == "exit":
            # the kernel ends the session: a SIGTERM that follows (its pod's deletion) writes no checkpoint
            self.runtime.term_checkpoint = None
        if op == "run":
            self.runtime.interrupts.expect()
        self.queue.put(command)

    def next(self) -> dict[str, Any] | None:
        """The next command, or ``None`` when the runner is asked to terminate."""
        while not self.runtime.interrupts.terminating:
            try:
                command = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            return command
        return None


def _load(command: dict[str, Any]) -> dict[str, Any]:
    if "bundle" in command:
        return read_bundle(str(command["bundle"]))
    if "bundle_b64" in command:
        try:
            data = base64.b64decode(command["bundle_b64"], validate=True)
        except (binascii.Error, TypeError) as exc:
            raise BundleError(
                f"bundle_b64 is not base64 ({exc}); encode the bundle bytes with base64"
            ) from exc
        return parse_bundle(data, "bundle_b64")
    raise BundleError(
        'a run command needs "bundle" (a path) or "bundle_b64"; e.g. {"op": "run", "bundle": P}'
    )


def serve(runtime: Runtime) -> int:
    """Run commands until ``exit``, end of stdin or termination; returns the exit code."""
    commands = _Commands(runtime)
    threading.Thread(target=commands.read, name="gpuo-commands", daemon=True).start()
    while True:
        command = commands.next()
        if command is None:
            from . import session_state

            session_state.at_term(runtime)  # SIGTERM: the state goes out if the kernel armed a checkpoint
            return TERMINATED_EXIT
        op = command.get("op")
        if op == "exit":
            return 0
        if op == "bad":
            _reject(
                runtime, f'session command {command["line"]!r} is not JSON with an "op"; send one per line'
            )
            continue
        if op in ("checkpoint", "restore", "on_term"):
            from . import session_state

            {"checkpoint": session_state.take, "restore": session_state.restore,
             "on_term": session_state.arm}[op](runtime, command)
            continue
        if op != "run":
            _reject(runtime, f"unknown session command {command!r}; use run, interrupt, checkpoint, restore, on_term or exit")
            continue
        try:
            bundle = _load(command)
        except BundleError as exc:
            runtime.interrupts.drop()
            _reject(runtime, str(exc))
            continue
        if runtime.version_mismatch(bundle["python"], bundle["run_id"]):
            return MISMATCH_EXIT
        runtime.run(bundle)


def _reject(runtime: Runtime, message: str) -> None:
    runtime.emit("error", ename="ProtocolError", evalue=message, traceback=[])
    runtime.emit("done", status="error", elapsed=0.0)
