"""The one retry policy: the backoff as a pure function, and the retry helper's bounds."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from gpu_offload.liqo_peering.errors import APIConflict, APIForbidden, APIServerError
from gpu_offload.liqo_peering.retrying import WATCH_BACKOFF, Backoff, retry, retry_async


def test_backoff_grows_exponentially_then_stays_at_the_cap() -> None:
    policy = Backoff(first=0.5, cap=30.0, factor=2.0, jitter=0.5)
    upper = [policy.delay(n, unit=0.0) for n in range(1, 10)]
    assert upper == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert policy.delay(0) == 0.0  # no failure yet: no wait
    assert policy.delay(10_000, unit=0.0) == 30.0  # a loop failing for days neither overflows nor grows


def test_jitter_spreads_each_wait_below_its_ceiling() -> None:
    policy = Backoff(first=1.0, cap=8.0, jitter=0.5)
    assert policy.delay(3, unit=0.0) == 4.0
    assert policy.delay(3, unit=0.5) == 3.0
    assert policy.delay(3, unit=0.999) == pytest.approx(2.002)
    drawn = {policy.delay(9) for _ in range(200)}  # random jitter: all in [4, 8], not all the same
    assert min(drawn) >= 4.0 and max(drawn) <= 8.0 and len(drawn) > 100
    assert Backoff(jitter=0.0).delay(2, unit=0.9) == 1.0


def test_a_policy_that_makes_no_sense_is_refused() -> None:
    with pytest.raises(ValueError, match="first <= cap"):
        Backoff(first=5.0, cap=1.0)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=1.5)


def test_watch_backoff_starts_soon_and_waits_at_most_half_a_minute() -> None:
    assert WATCH_BACKOFF.delay(1, unit=0.0) <= 0.5
    assert WATCH_BACKOFF.delay(50, unit=0.0) == 30.0


def test_retry_tries_again_only_what_it_is_told_and_at_most_attempts_times() -> None:
    quick = Backoff(first=0.001, cap=0.002, attempts=3)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise APIServerError("creating", "Pod a/b", 500, "etcd")
        return "made"

    assert retry(flaky, quick, lambda e: isinstance(e, APIServerError)) == "made"
    assert len(calls) == 3

    calls.clear()

    def always() -> str:
        calls.append(1)
        raise APIServerError("creating", "Pod a/b", 500, "etcd")

    with pytest.raises(APIServerError):
        retry(always, quick, lambda e: isinstance(e, APIServerError))
    assert len(calls) == 3  # bounded

    calls.clear()

    def conflict() -> str:
        calls.append(1)
        raise APIConflict("creating", "Pod a/b", 409, "exists")

    with pytest.raises(APIConflict):
        retry(conflict, quick, lambda e: isinstance(e, APIServerError))
    assert len(calls) == 1  # not retried: raised as it is


def test_retry_waits_between_attempts_and_a_stop_ends_the_wait() -> None:
    slow = Backoff(first=0.2, cap=0.2, jitter=0.0, attempts=3)
    started = time.monotonic()
    with pytest.raises(APIServerError):
        retry(lambda: (_ for _ in ()).throw(APIServerError("a", "b", 500, "c")), slow, lambda e: True)
    assert time.monotonic() - started >= 0.4  # two waits of 0.2 s between three attempts

    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    with pytest.raises(APIServerError):
        retry(lambda: (_ for _ in ()).throw(APIServerError("a", "b", 500, "c")),
              Backoff(first=10.0, cap=10.0), lambda e: True, stop)
    assert time.monotonic() - started < 5


def test_retry_async_reports_each_retry() -> None:
    seen: list[tuple[int, float]] = []
    calls: list[int] = []

    async def forbidden_twice() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise APIForbidden("creating", "RoleBinding ns/x", 403, "not yet")
        return "ok"

    result = asyncio.run(retry_async(forbidden_twice, Backoff(first=0.001, cap=0.004, attempts=8),
                                     lambda e: isinstance(e, APIForbidden), lambda e, n, p: seen.append((n, p))))
    assert result == "ok"
    assert [n for n, _ in seen] == [1, 2]
    assert all(0 < p <= 0.004 for _, p in seen)
