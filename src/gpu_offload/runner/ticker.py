"""One helper thread that does the runner's periodic work while a cell runs.

Sampling GPU metrics (``metrics``) and watching the GPU memory a part of a GPU holds (``gpu_watch``) both act
every ``metrics_interval`` seconds during a run: one thread ticks for both rather than one thread each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .signals import block_in_this_thread

Task = Callable[[], None]
"""Work done at each tick (at once, then every interval); it must return promptly and raise nothing."""


class Ticker:
    """Calls its tasks at :meth:`start` and then every ``interval`` seconds until :meth:`stop`."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval: float, tasks: Iterable[Task | None]) -> None:
        """Begin ticking for the tasks given (``None``: a task with nothing to do this run); none: no thread."""
        todo = [task for task in tasks if task is not None]
        if not todo:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(todo, max(0.05, float(interval))),
                                        name="gpuo-ticker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking (returns promptly; the thread ends at its next tick)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def _loop(self, tasks: list[Task], interval: float) -> None:
        block_in_this_thread()
        while True:
            for task in tasks:
                task()
            if self._stop.wait(interval):
                return
