"""Container log buffers: what ``pods/log`` serves, written by whoever runs the containers.

Extension point (part 2's kubelet)::

    api.logs.write(namespace, pod, container, b"text from the process\\n")   # any thread, any chunking
    api.logs.close(namespace, pod, container)   # the container ended: followers see the end of the stream
    api.logs.cut(namespace, pod)                # fault: drop every open follow stream of the pod mid-way

Lines are kept whole with the time their newline arrived (a trailing partial line is flushed by ``close``),
so ``timestamps``, ``sinceTime``/``sinceSeconds`` and ``tailLines`` behave as on a kubelet. Writing after
``close`` reopens the buffer (a restarted container appends, as ``kubectl logs`` shows). A deleted pod's
buffers are dropped by the API layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone


class LogStreamCut(Exception):
    """Raised inside a follow stream that a fault cut; the HTTP layer then drops the connection."""


@dataclass(frozen=True)
class LogLine:
    """One line of container output (with its newline, if it had one) and when it was written."""

    time: datetime
    text: bytes

    def rfc3339(self) -> str:
        """The kubelet's timestamp prefix format (RFC 3339 with nanoseconds, UTC)."""
        return self.time.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


@dataclass
class _Buffer:
    lines: list[LogLine] = field(default_factory=list)
    partial: bytes = b""
    closed: bool = False
    cuts: int = 0
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)

    def wake(self) -> None:
        for loop, event in self.waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)
        self.waiters.clear()


@dataclass(frozen=True)
class LogQuery:
    """The ``pods/log`` query parameters that select lines."""

    follow: bool = False
    since_time: datetime | None = None
    tail_lines: int | None = None
    limit_bytes: int | None = None


class LogBuffers:
    """All container log buffers of one API server; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[tuple[str, str, str], _Buffer] = {}

    def write(self, namespace: str, pod: str, container: str, data: bytes | str,
              when: datetime | None = None) -> None:
        """Append output of a container; complete lines become visible to readers at once."""
        raw = data.encode() if isinstance(data, str) else data
        now = when or datetime.now(timezone.utc)
        with self._lock:
            buf = self._buffers.setdefault((namespace, pod, container), _Buffer())
            buf.closed = False
            chunks = (buf.partial + raw).split(b"\n")
            buf.partial = chunks.pop()
            buf.lines += [LogLine(now, c + b"\n") for c in chunks]
            if chunks:
                buf.wake()

    def close(self, namespace: str, pod: str, container: str) -> None:
        """The container stopped: flush a partial line and end every follow stream after its last line."""
        with self._lock:
            buf = self._buffers.setdefault((namespace, pod, container), _Buffer())
            if buf.partial:
                buf.lines.append(LogLine(datetime.now(timezone.utc), buf.partial))
                buf.partial = b""
            buf.closed = True
            buf.wake()

    def cut(self, namespace: str, pod: str) -> int:
        """Fault: break every open follow stream of the pod; returns how many buffers were affected."""
        with self._lock:
            hits = [b for (ns, p, _), b in self._buffers.items() if (ns, p) == (namespace, pod)]
            for buf in hits:
                buf.cuts += 1
                buf.wake()
            return len(hits)

    def drop(self, namespace: str, pod: str) -> None:
        """Forget a deleted pod's logs; its followers end."""
        with self._lock:
            for key in [k for k in self._buffers if k[:2] == (namespace, pod)]:
                buf = self._buffers.pop(key)
                buf.closed = True
                buf.wake()

    def has(self, namespace: str, pod: str, container: str) -> bool:
        """Whether the container ever wrote (or was started by a kubelet that closed it)."""
        with self._lock:
            return (namespace, pod, container) in self._buffers

    def _first_index(self, buf: _Buffer, query: LogQuery) -> int:
        start = 0
        if query.since_time is not None:
            start = next((i for i, ln in enumerate(buf.lines) if ln.time >= query.since_time), len(buf.lines))
        if query.tail_lines is not None:
            start = max(start, len(buf.lines) - query.tail_lines)
        return start

    async def read(self, namespace: str, pod: str, container: str, query: LogQuery,
                   gone: Callable[[], bool] = lambda: False) -> AsyncIterator[LogLine]:
        """Lines selected by ``query``; with ``follow``, waits for more until the container closes (or
        ``gone()`` says the reader went away, checked every couple of seconds while idle)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            buf = self._buffers.setdefault((namespace, pod, container), _Buffer())
            index, cuts = self._first_index(buf, query), buf.cuts
        sent = 0
        while True:
            event = asyncio.Event()
            with self._lock:
                fresh, index = buf.lines[index:], len(buf.lines)
                done = buf.closed or not query.follow
                was_cut = buf.cuts != cuts
                if not fresh and not done and not was_cut:
                    buf.waiters.append((loop, event))
            for line in fresh:
                if query.limit_bytes is not None and sent + len(line.text) > query.limit_bytes:
                    return
                sent += len(line.text)
                yield line
            if was_cut:
                raise LogStreamCut(f"log stream of pod {namespace}/{pod} was cut by a fault")
            if done and not fresh:
                return
            if not fresh:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), 2.0)
                if gone():
                    return
