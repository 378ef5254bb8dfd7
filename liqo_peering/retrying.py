"""The one retry policy of the project: jittered exponential backoff with a cap, and the loops that use it.

Every place that tries again (a watch that failed, a log stream that was refused, a create the server
answered 5xx, a write that lost a race, RBAC that is still propagating) waits ``Backoff.delay(attempt)``
between attempts, so no loop hammers a refusing server and many clients that failed together do not
retry together (the jitter spreads them, as client-go's wait.Backoff does).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How long to wait before attempt ``n + 1`` after ``n`` failures in a row."""

    first: float = 0.5
    """Seconds before the second attempt (before jitter)."""
    cap: float = 30.0
    """No wait is longer than this, however many failures came before."""
    factor: float = 2.0
    """Each further failure multiplies the wait by this."""
    jitter: float = 0.5
    """The fraction of the wait that is random: a wait lies in [(1 - jitter) * d, d]."""
    attempts: int = 0
    """For ``retry``: attempts in all, the first included (0: no limit, for loops that run until stopped)."""

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < self.first or self.factor < 1 or not 0 <= self.jitter <= 1 or self.attempts < 0:
            raise ValueError(f"{self!r}: need 0 <= first <= cap, factor >= 1, 0 <= jitter <= 1, attempts >= 0")

    def delay(self, failures: int, unit: float | None = None) -> float:
        """The wait after ``failures`` (>= 1) failures in a row; ``unit`` in [0, 1) picks the jitter (random
        when None), so the policy is a pure function of its inputs."""
        if failures < 1:
            return 0.0
        # the exponent is bounded before the power: a loop that failed for days must not overflow a float
        grown = self.first * self.factor ** min(failures - 1, 64)
        ceiling = min(grown, self.cap)
        u = random.random() if unit is None else unit
        return ceiling * (1 - self.jitter * u)


WATCH_BACKOFF = Backoff(first=0.5, cap=30.0)
"""Between failed list/watch requests and refused log streams: soon at first, at most every 30 s."""


def _pause(exc: Exception, failures: int, backoff: Backoff, retry_on: Callable[[Exception], bool]) -> float:
    """The wait before the next attempt after ``failures`` failures; raises ``exc`` when none is due."""
    if not retry_on(exc) or failures == backoff.attempts:
        raise exc
    return backoff.delay(failures)


def retry(call: Callable[[], T], backoff: Backoff, retry_on: Callable[[Exception], bool],
          stop: threading.Event | None = None) -> T:
    """``call()`` until it returns, waiting ``backoff.delay`` after each failure ``retry_on`` accepts.

    The last failure (or one ``retry_on`` refuses) is raised as it is; ``backoff.attempts`` bounds the tries.
    A set ``stop`` ends the waiting early and raises the last failure.
    """
    failures = 0
    while True:
        try:
            return call()
        except Exception as exc:
            failures += 1
            pause = _pause(exc, failures, backoff, retry_on)
            if stop is None:
                time.sleep(pause)
            elif stop.wait(pause):
                raise


async def retry_async(call: Callable[[], Awaitable[T]], backoff: Backoff, retry_on: Callable[[Exception], bool],
                      on_retry: Callable[[Exception, int, float], None] | None = None) -> T:
    """``retry`` for coroutines (the hub's kubernetes_asyncio calls); ``on_retry(exc, failures, pause)`` may
    log each retry."""
    failures = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            failures += 1
            pause = _pause(exc, failures, backoff, retry_on)
            if on_retry is not None:
                on_retry(exc, failures, pause)
            await asyncio.sleep(pause)
