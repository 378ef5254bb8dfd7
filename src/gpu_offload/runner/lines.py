"""Splitting a byte stream into lines in linear time with a bounded buffer.

Shared by the frame decoder and the log followers. Joining each chunk onto the unfinished line
(``pending += chunk``) and splitting again costs time quadratic in a line's length, and a peer that never
ends its line would grow the buffer without bound; here a line longer than ``max_line`` bytes is cut off:
its head is kept for diagnostics and the rest is skipped up to the next newline.
"""

from __future__ import annotations

from dataclasses import dataclass

OVERLONG_HEAD = 200
"""Bytes of an overlong line kept to name it in a diagnostic."""


@dataclass(frozen=True)
class Overlong:
    """A line that exceeded the limit: its first bytes and its full length (what was skipped is gone)."""

    head: bytes
    size: int


class LineSplitter:
    """Feed bytes in chunks of any size; get back complete lines (without the newline) or :class:`Overlong`.

    Work is linear in the input and memory is bounded by ``max_line`` plus the chunk being fed.
    """

    def __init__(self, max_line: int) -> None:
        if max_line < OVERLONG_HEAD:
            raise ValueError(f"max_line {max_line} is below {OVERLONG_HEAD} bytes; give a larger limit")
        self.max_line = max_line
        self._pending: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set while skipping the rest of an overlong line

    def feed(self, data: bytes) -> list[bytes | Overlong]:
        """Split ``data``; a trailing partial line waits for the next chunk or :meth:`close`."""
        pieces = data.split(b"\n")
        out: list[bytes | Overlong] = []
        for piece in pieces[:-1]:
            out.append(self._finish(piece))
        self._keep(pieces[-1])
        return out

    def close(self) -> list[bytes | Overlong]:
        """End of stream: the last line, if it was not empty."""
        if not self._size:
            return []
        return [self._finish(b"")]

    def _keep(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._head is not None:
            return
        if self._size <= self.max_line:
            self._pending.append(piece)
            return
        self._head = b"".join(self._pending)[:OVERLONG_HEAD]
        if len(self._head) < OVERLONG_HEAD:
            self._head += piece[: OVERLONG_HEAD - len(self._head)]
        self._pending = []

    def _finish(self, piece: bytes) -> bytes | Overlong:
        self._keep(piece)
        result: bytes | Overlong
        if self._head is not None:
            result = Overlong(self._head, self._size)
        else:
            result = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._reset()
        return result

    def _reset(self) -> None:
        self._pending = []
        self._size = 0
        self._head = None
