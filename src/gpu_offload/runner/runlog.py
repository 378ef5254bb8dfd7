"""A run's log, kept where it outlives the pod: the text the run showed, uploaded at its end.

A ``gpu-offload run --noblock`` on a cluster is followed by a process on the user's machine; if that
process dies, or the user asks from another machine, only the pod had the output, and it goes with the pod.
When the bundle names a ``log_url`` (a presigned PUT URL for this run's ``log`` object, signed by the
user's storage credentials: the pod holds no credentials), the runner keeps what it sent as text (streams,
the text form of displays, error tracebacks), at most :data:`LIMIT` bytes (the end, when longer), and
uploads it before its ``done`` frame, so the log is there when the pod is deleted after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

LIMIT = 8 * 2**20
"""Bytes of a run's log kept (the last ones); a longer log starts with a line saying how much was cut."""


class RunLog:
    """The text of one run, while the bundle asks for it to be kept."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.url = ""
        self._parts: deque[bytes] = deque()
        self._size = 0
        self._cut = 0

    def begin(self, url: str) -> None:
        """Keep the text of the run that starts now (nothing when ``url`` is empty)."""
        self.url = url
        self._parts.clear()
        self._size = self._cut = 0

    def add(self, text: str) -> None:
        """Keep ``text``, dropping the oldest parts beyond the limit."""
        if not self.url or not text:
            return
        data = text.encode("utf-8", "replace")
        self._parts.append(data)
        self._size += len(data)
        while self._size > self.limit and len(self._parts) > 1:
            dropped = self._parts.popleft()
            self._size -= len(dropped)
            self._cut += len(dropped)

    def frame(self, kind: str, payload: Mapping[str, Any]) -> None:
        """Keep the text a terminal shows of a frame (as ``gpu-offload run`` prints it)."""
        if kind == "display_data":
            data = payload.get("data") or {}
            self.add(f"{data.get('text/plain', '')}\n")
        elif kind == "error":
            lines: Sequence[str] = payload.get("traceback") or ()
            self.add("".join(lines) or f"{payload.get('ename')}: {payload.get('evalue')}\n")

    def content(self) -> bytes:
        """What is uploaded."""
        head = f"[gpu-offload: the first {self._cut} bytes of this log were not kept]\n".encode() if self._cut else b""
        return head + b"".join(self._parts)

    def upload(self) -> str:
        """PUT the log to its URL; returns a sentence on failure (the run's result does not depend on it)."""
        if not self.url:
            return ""
        from .buffers import BufferTransportError, _put

        url, self.url = self.url, ""
        try:
            _put(url, memoryview(self.content()))
        except BufferTransportError as exc:
            return f"the run's log was not kept in object storage: {exc}"
        return ""
