"""File-descriptor level capture of stdout and stderr, re-sent as ``stream`` frames as soon as they arrive.

Redirecting fds 1 and 2 (not just ``sys.stdout``) is what makes C extensions and subprocesses of the cell
stream too. Frames themselves go to a private duplicate of the original stdout that is close-on-exec and
that user code is never handed, so nothing the cell prints can be read as a frame.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import io
import os
import select
import sys
import termios
import threading
from collections.abc import Callable

from .signals import block_in_this_thread

READ_SIZE = 64 * 1024
MAX_TEXT = 8 * 1024
"""Longest text per stream frame, so ordinary output never needs ``part`` frames."""


def private_stdout() -> int:
    """A close-on-exec duplicate of fd 1, taken before fd 1 is redirected: the frames' only way out."""
    return os.dup(1)  # os.dup makes non-inheritable (close-on-exec) descriptors


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FdCapture:
    """Points fds 1 and 2 at pipes whose reader thread calls ``emit(name, text)`` for what arrives.

    Nothing is held back waiting for a newline or a batch: the engine's goal for print-to-display latency
    is a few milliseconds, and Jupyter joins stream text anyway.
    """

    def __init__(self, emit: Callable[[str, str], None]) -> None:
        self._emit = emit
        self._fds: dict[int, str] = {}
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._waiting: list[threading.Event] = []
        self._stopping = False
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="gpuo-capture", daemon=True)

    def start(self) -> None:
        """Redirect fds 1 and 2 and start streaming."""
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)  # dup2 makes fd inheritable: subprocesses write into the pipe too
            os.close(write_end)
            os.set_blocking(read_end, False)
            self._fds[read_end] = name
            self._decoders[read_end] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # a pipe is not a terminal, so Python would buffer whole blocks: flush at every newline instead
        sys.stdout = _text_stream(1)
        sys.stderr = _text_stream(2)
        self._thread.start()

    def flush(self, timeout: float = 10.0) -> None:
        """Return once everything written to fds 1 and 2 so far has been emitted."""
        for stream in (sys.stdout, sys.stderr):
            # a cell may close or replace sys.stdout; what reached the fd is drained all the same
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        if not self._pending():
            return
        done = threading.Event()
        with self._lock:
            self._waiting.append(done)
        os.write(self._wake_w, b"f")
        done.wait(timeout)

    def _pending(self) -> bool:
        """Whether output may be written but not yet emitted (a wake-up costs two thread switches)."""
        # the reader marks itself busy before it reads, so "pipes empty and reader idle" means emitted
        if self._busy:
            return True
        for fd in self._fds:
            if fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0") != b"\0\0\0\0":
                return True
        return self._busy

    def stop(self) -> None:
        """Drain what is left and end the reader thread (fds 1 and 2 stay redirected)."""
        self.flush()
        self._stopping = True
        os.write(self._wake_w, b"s")  # wake the reader even when nothing is pending, so it can end
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        block_in_this_thread()
        watched = [*self._fds, self._wake_r]
        while True:
            ready, _, _ = select.select(watched, [], [])
            self._busy = True
            for fd in ready:
                if fd != self._wake_r and not self._drain(fd):
                    # every writer closed it (the cell closed fd 1, say): an EOF pipe stays readable,
                    # so stop watching it or the loop would spin
                    watched.remove(fd)
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
                for fd in self._fds:
                    self._drain(fd)
                with self._lock:
                    waiting, self._waiting = self._waiting, []
                for event in waiting:
                    event.set()
                if self._stopping:
                    return
            self._busy = False

    def _drain(self, fd: int) -> bool:
        """Emit what ``fd`` holds; ``False`` at end of file."""
        while True:
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return True
            if not data:
                return False
            text = self._decoders[fd].decode(data)
            for piece in split_text(text):
                self._emit(self._fds[fd], piece)
            if len(data) < READ_SIZE:
                return True


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def split_text(text: str, limit: int = MAX_TEXT) -> list[str]:
    """Cut ``text`` into pieces of at most ``limit`` characters, at a newline where there is one."""
    pieces = []
    while len(text) > limit:
        cut = text.rfind("\n", 0, limit) + 1 or limit
        pieces.append(text[:cut])
        text = text[cut:]
    if text:
        pieces.append(text)
    return pieces
