"""Capture of stdout and stderr, re-sent as ``stream`` frames as soon as they arrive.

Redirecting fds 1 and 2 (not just ``sys.stdout``) is what makes C extensions and subprocesses of the cell
stream too. Python's own ``sys.stdout`` and ``sys.stderr`` skip that pipe: a line printed is sent as a frame
by the thread that printed it, after whatever reached the fd before it, so a print costs no wake-up of the
reader thread (which waited for the GIL of a busy cell, up to its 5 ms switch interval). Frames themselves go
to a private duplicate of the original stdout that is close-on-exec and that user code is never handed, so
nothing the cell prints can be read as a frame.
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

from .signals import block_in_this_thread, masked

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

    Nothing is held back waiting for a batch: the engine's goal for print-to-display latency is a few
    milliseconds, and Jupyter joins stream text anyway. ``sys.stdout`` and ``sys.stderr`` send at every
    newline (and at every ``flush``), as a terminal's line buffering would.
    """

    def __init__(self, emit: Callable[[str, str], None]) -> None:
        self._emit = emit
        self._fds: dict[int, str] = {}
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._pipes: dict[int, int] = {}
        """The read end of each redirected fd (1, 2)."""
        self._reading = threading.RLock()
        """Held while reading a pipe or sending direct text, so text leaves in the order it was written
        (re-entrant: a signal handler of the cell may print while its thread is printing)."""
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
            self._pipes[fd] = read_end
            self._decoders[read_end] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sys.stdout = _LineStream(self, 1)
        sys.stderr = _LineStream(self, 2)
        self._thread.start()

    def send(self, fd: int, text: str) -> None:
        """Emit what Python wrote to ``sys.stdout`` (fd 1) or ``sys.stderr`` (fd 2), after what reached the fd."""
        with self._reading:
            self._drain(self._pipes[fd])
            for piece in split_text(text):
                self._emit(self._fds[self._pipes[fd]], piece)

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
        with self._reading:
            return self._drain_locked(fd)

    def _drain_locked(self, fd: int) -> bool:
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


class _LineStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr``: text goes out as frames at every newline or ``flush``, sent by the
    thread that wrote it. Bytes written to ``.buffer`` go through the fd, as before."""

    encoding = "utf-8"
    errors = "backslashreplace"
    line_buffering = True

    def __init__(self, capture: FdCapture, fd: int) -> None:
        super().__init__()
        self._capture = capture
        self._fd = fd
        self._pending: list[str] = []
        self._size = 0
        self.buffer = io.BufferedWriter(io.FileIO(fd, "w", closefd=False))

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd  # what writes at the fd level (a subprocess given sys.stdout) reaches the pipe

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._pending.append(text)
        self._size += len(text)
        if "\n" in text or "\r" in text or self._size >= MAX_TEXT:
            self.flush()
        return len(text)

    def flush(self) -> None:
        self.buffer.flush()
        if not self._pending:
            return
        if threading.current_thread() is threading.main_thread():
            # an interrupt lands after the text is sent and taken off, never between: nothing is sent twice
            with masked():
                self._send()
        else:
            self._send()

    def _send(self) -> None:
        text = "".join(self._pending)
        self._pending, self._size = [], 0
        # what the encoding of the fd would have turned into escapes (lone surrogates)
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        self._capture.send(self._fd, text)


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
