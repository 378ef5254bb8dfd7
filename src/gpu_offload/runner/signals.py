"""Interrupts: SIGINT/SIGTERM (and the session's ``interrupt`` command) become KeyboardInterrupt in the cell.

Helper threads block these signals so the kernel always delivers them to the main thread, the one running
the cell: a signal landing on another thread would not wake a ``time.sleep`` in the cell.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

HANDLED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def block_in_this_thread() -> None:
    """Call first thing in every helper thread."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)


class Interrupts:
    """Decides when a signal may raise KeyboardInterrupt: only while a run is in progress.

    ``one_shot`` runners raise at any time (there is nothing to keep); a session raises only inside a run,
    so an interrupt that arrives between cells cannot break the runner's own loop.
    """

    def __init__(self, one_shot: bool) -> None:
        self.one_shot = one_shot
        self.running = False
        self.terminating = False
        self.pending = False
        """An interrupt arrived for a run that was sent but has not started yet."""
        self._expected = 0  # runs sent (session commands) that have not started or been dropped
        self._lock = threading.Lock()
        self._main = threading.main_thread().ident
        self.on_terminate: Callable[[], None] | None = None
        """Called once, in the handler, when SIGTERM stops a run in progress (the notice frame, before the
        cell's KeyboardInterrupt): safe because the main thread emits frames with these signals masked."""

    def install(self) -> None:
        """Install the handlers (main thread only)."""
        signal.signal(signal.SIGINT, self._on_interrupt)
        signal.signal(signal.SIGTERM, self._on_terminate)

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.running or self.one_shot:
            raise KeyboardInterrupt

    def _on_terminate(self, signum: int, frame: FrameType | None) -> None:
        first = not self.terminating
        self.terminating = True
        if self.running and first and self.on_terminate is not None:
            self.on_terminate()
        if self.running or self.one_shot:
            raise KeyboardInterrupt

    def expect(self) -> None:
        """A run command arrived (reader thread): an interrupt from now on is meant for it."""
        with self._lock:
            self._expected += 1

    def drop(self) -> None:
        """An expected run was rejected before it started (a bad bundle): forget an interrupt for it."""
        with self._lock:
            self._expected = max(0, self._expected - 1)
            if not self._expected:
                self.pending = False

    def begin(self) -> None:
        """A run starts (main thread); raises KeyboardInterrupt at once if it was interrupted already."""
        with self._lock:
            self._expected = max(0, self._expected - 1)
            self.running = True
            interrupted, self.pending = self.pending, False
        if interrupted:
            raise KeyboardInterrupt

    def interrupt(self) -> None:
        """Interrupt the running cell from any thread, or the next run if it was sent but not started.

        The lock makes "not running yet" and "remember it" one step, so an interrupt that arrives while
        the main thread is reading the bundle is not lost.
        """
        with self._lock:
            if self.running:
                assert self._main is not None
                signal.pthread_kill(self._main, signal.SIGINT)
            elif self._expected:
                self.pending = True

    def terminate(self) -> None:
        """Ask the main thread to stop (used by the parent-death watchdog from any thread)."""
        assert self._main is not None
        signal.pthread_kill(self._main, signal.SIGTERM)


class masked:
    """Context manager: hold the handled signals off while a frame is written, so no frame is cut short."""

    def __enter__(self) -> None:
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)

    def __exit__(self, *exc: object) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
