"""Writing frames (the runner's side of :mod:`.frames`): ``\\x1egpuo <nonce> <seq> <run> <rank> <kind> <payload>\\n``.

Kept apart from the decoder and its event classes, which only the engine needs, because everything the
runner imports is paid for on every cold start.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable
from typing import Any

from .signals import masked

MAX_FRAME_BYTES = 16 * 1024
"""Longest frame line in bytes, newline included."""

RELAY_ROOM = 24
"""Bytes a rank's frames leave free under :data:`MAX_FRAME_BYTES`: its node's launcher (``ranks.py``)
writes its own ``seq`` (up to 18 digits) and the rank (up to 6) in their place, so a relayed line fits."""

MARK = "\x1egpuo"
"""What every frame line starts with (an ASCII record separator, then a fixed tag)."""

NO_RUN = "-"
"""The run field of frames that belong to the runner process rather than to one run (``hello``)."""

_NONCE_RE = re.compile(r"[0-9a-f]{32}\Z")
_RUN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def check_nonce(nonce: str) -> str:
    """Return ``nonce`` if it is 32 lower-case hex characters, else raise ``ValueError`` saying so."""
    if not isinstance(nonce, str) or not _NONCE_RE.match(nonce):
        raise ValueError(
            f"frame nonce {nonce!r} is not 32 lower-case hex characters; "
            "create one with secrets.token_hex(16)"
        )
    return nonce


def run_token(run_id: str) -> str:
    """The run field a frame carries for ``run_id``: the id itself when it is a plain name (what the engine
    makes), else a digest of it, so that any bundle's ``run_id`` fits one space-free field."""
    if _RUN_RE.match(run_id):
        return run_id
    import hashlib  # only for odd ids: the runner's cold start does not pay for it

    return "h" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class FrameEncoder:
    """Writes events as frame lines through ``write`` (which must write all the bytes it is given).

    Thread-safe: the stream reader, the metrics sampler and the main thread all emit, and the lock makes
    the order of ``seq`` the order of the lines. Every frame carries the run it belongs to (set by
    :meth:`begin_run`, :data:`NO_RUN` outside a run) and the runner's rank (0 until distributed runs).
    """

    def __init__(
        self, nonce: str, write: Callable[[bytes], object], limit: int = MAX_FRAME_BYTES, rank: int = 0
    ) -> None:
        self.nonce = check_nonce(nonce)
        self._write = write
        self._limit = limit
        self._rank = int(rank)
        self._run = NO_RUN
        self._seq = 0
        self._part_id = 0
        self._lock = threading.Lock()
        self._held: list[bytes] | None = None

    def hold(self) -> None:
        """Keep the frames from now on (of every thread, in order) until :meth:`release` writes them at once."""
        with self._locked():
            if self._held is None:
                self._held = []

    def release(self) -> None:
        """Write the frames kept since :meth:`hold` in one write; nothing if none are kept."""
        with self._locked():
            held, self._held = self._held, None
            if held:
                self._write(b"".join(held))

    def begin_run(self, run_id: str) -> None:
        """Frames from now on belong to ``run_id`` (a bundle's ``run_id``)."""
        with self._locked():
            self._run = run_token(run_id)

    def end_run(self) -> None:
        """Frames from now on belong to no run (between the runs of a session)."""
        with self._locked():
            self._run = NO_RUN

    def _locked(self) -> contextlib.AbstractContextManager[Any]:
        """The encoder's lock; taken by the main thread with SIGINT/SIGTERM held off, so a signal handler (the
        SIGTERM notice, ``signals.Interrupts.on_terminate``) may emit without finding the lock held by the very
        thread it interrupted."""
        if threading.current_thread() is not threading.main_thread():
            return self._lock
        stack = contextlib.ExitStack()
        stack.enter_context(masked())
        stack.enter_context(self._lock)
        return stack

    def emit(self, kind: str, **payload: Any) -> None:
        """Send one event; split into ``part`` frames when it would not fit in one line."""
        # default=str: a rich repr holding e.g. numpy numbers must not fail the cell that displays it
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True, default=str)
        with self._locked():
            line = self._line(kind, body)
            if len(line) <= self._limit:
                self._send(line)
            else:
                self._emit_parts(kind, body)

    def _send(self, line: bytes) -> None:
        if self._held is None:
            self._write(line)
        else:
            self._held.append(line)

    def _line(self, kind: str, body: str) -> bytes:
        # ensure_ascii JSON is ASCII, so characters are bytes and no raw newline can appear
        line = f"{self._header()} {kind} {body}\n".encode("ascii")
        self._seq += 1
        return line

    def _header(self) -> str:
        return f"{MARK} {self.nonce} {self._seq} {self._run} {self._rank}"

    def _emit_parts(self, kind: str, body: str) -> None:
        part_id = self._part_id
        self._part_id += 1
        start = 0
        while start < len(body):
            frame_overhead = len(f"{self._header()} part ") + 1
            wrapper = len(json.dumps({"id": part_id, "kind": kind, "chunk": "", "last": False}))
            budget = self._limit - frame_overhead - wrapper
            end = _fit(body, start, budget)
            chunk = body[start:end]
            start = end
            part = {"id": part_id, "kind": kind, "chunk": chunk, "last": start >= len(body)}
            self._send(self._line("part", json.dumps(part, separators=(",", ":"), ensure_ascii=True)))


def _fit(text: str, start: int, budget: int) -> int:
    """End index of the longest slice from ``start`` whose JSON string encoding fits ``budget`` bytes."""
    if budget < 8:
        raise ValueError(f"frame limit too small: {budget} bytes left for a part's chunk")
    end = min(len(text), start + budget)
    while True:
        piece = text[start:end]
        # the text is ASCII JSON without control characters: only quote and backslash grow (to 2 bytes)
        cost = len(piece) + piece.count('"') + piece.count("\\")
        if cost <= budget:
            return end
        end -= max(1, (cost - budget + 1) // 2)
