"""The hub's threads that follow the inventory (price book, GPU samples, queue controller): one daemon thread
each, woken by the watch-fed inventory cache's changes rather than by polling the API."""

from __future__ import annotations

import logging
import threading
from typing import TypeVar

from gpu_offload.liqo_peering.cache import InventoryCache

log = logging.getLogger("gpu_offload.hub")
F = TypeVar("F", bound="InventoryFollower")


class InventoryFollower:
    """Calls ``follow()`` after each inventory change (and at least every ``wait()`` seconds); ``start()``, then
    ``close()``. A failing ``follow()`` is logged as ``failure`` and retried after ``RETRY_SECONDS``: the thread
    outlives any one failure."""

    RETRY_SECONDS = 5.0
    failure = "could not follow the inventory"

    def __init__(self, cache: InventoryCache, name: str) -> None:
        self.cache = cache
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self: F) -> F:
        """Start the thread."""
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait briefly for it."""
        self._stop.set()
        self._thread.join(timeout)

    def follow(self) -> None:
        """What to do with the current inventory."""

    def wait(self) -> float:
        """Seconds to wait for a change before following anyway; at most a second so ``close()`` is prompt."""
        return 1.0

    def _run(self) -> None:
        generation = -1
        while not self._stop.is_set():
            generation = self.cache.wait_changed(generation, self.wait())
            try:
                self.follow()
            except Exception as exc:  # noqa: BLE001 - see the class: logged, retried
                log.warning("%s: %s", self.failure, exc)
                self._stop.wait(self.RETRY_SECONDS)
