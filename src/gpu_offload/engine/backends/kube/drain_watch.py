"""Moving idle sessions off a donor being drained before the drain reaches them: one thread per backend.

A cordon (``spec.unschedulable``, or the hub's cordon label) reaches the kernel through the inventory cache's
Node watch (``liqo_peering.watching.ListWatch``, the one watch loop), so this thread opens no watch of its own and
polls nothing: it sleeps on the cache's change counter (``InventoryCache.wait_changed``) and, at each change or
when a session goes idle (``poke``) or a look asked for another (``again_in``), lets the backend look at its idle sessions. A burst of events (a drain
evicting many pods) is taken as one look, and a look with no idle session reads nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from ....liqo_peering.cache import InventoryCache

WAKE_SECONDS = 1.0
"""Longest sleep between looks at the stop and poke flags: no API request is made at a wake without a change."""
SETTLE_SECONDS = 0.5
"""Pause after a look, so the events of one drain are taken together."""


class DrainWatch:
    """Calls ``look`` (in this thread) after each change of ``cache`` and after each ``poke``."""

    def __init__(self, cache: InventoryCache, look: Callable[[], None]) -> None:
        self._cache = cache
        self._look = look
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._due: float | None = None
        self._thread = threading.Thread(target=self._run, name="gpu-offload-drain-watch", daemon=True)

    def start(self) -> DrainWatch:
        self._thread.start()
        return self

    def poke(self) -> None:
        """Look again soon although the inventory did not change (a session went idle on a cordoned node)."""
        self._poked.set()

    def again_in(self, seconds: float) -> None:
        """Look again after ``seconds`` although nothing changes (a cordon must last a moment before a move)."""
        due = time.monotonic() + seconds
        self._due = due if self._due is None else min(self._due, due)

    def close(self, timeout: float = 5.0) -> None:
        """Stop; a move under way finishes in the thread (the backend's close waits for it)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        seen = -1  # the first look is at once: a node cordoned before the watch started
        while not self._stop.is_set():
            now = self._cache.wait_changed(seen, WAKE_SECONDS)
            if self._stop.is_set():
                return
            due = self._due is not None and time.monotonic() >= self._due
            if now == seen and not self._poked.is_set() and not due:
                continue
            seen = now
            self._poked.clear()
            if due:
                self._due = None
            # the thread must outlive a failed look: the next change looks again, and a cell's own check remains
            with contextlib.suppress(Exception):
                self._look()
            self._stop.wait(SETTLE_SECONDS)
