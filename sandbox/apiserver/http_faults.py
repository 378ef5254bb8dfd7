"""Injectable HTTP faults: an error status or added latency on requests whose path matches a pattern.

Extension point (part 2's fault injection and its control endpoint)::

    rule = api.faults.add(FaultRule(path=r"/api/v1/namespaces/[^/]+/pods$", methods=("POST",),
                                    status=503, times=2))
    ...
    api.faults.remove(rule)

A rule with ``status`` answers that code with a ``Status`` body (503 also carries Retry-After, so
clients that retry do); a rule with ``delay`` sleeps before the request is served normally; a ``hold``
rule keeps the request waiting until the test calls ``release(rule)`` (``delay`` bounds the wait), so a
test can act while a client's request is in flight, whatever the machine's load. ``times`` limits how
often a rule fires (0: until removed). Cutting a log stream is ``api.logs.cut(ns, pod)``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from .errors import ApiError

REASONS = {429: "TooManyRequests", 500: "InternalError", 502: "InternalError", 503: "ServiceUnavailable",
           504: "Timeout"}


@dataclass(frozen=True)
class FaultRule:
    """Fail or slow down requests whose URL path matches ``path`` (a regular expression, searched)."""

    path: str
    methods: tuple[str, ...] = ()  # empty: every method
    status: int = 0  # 0: no error
    delay: float = 0.0  # seconds added before serving (with ``hold``: the longest it is held)
    times: int = 0  # 0: unlimited
    hold: bool = False  # held until ``Faults.release(rule)`` (or ``delay`` ran out): races made deterministic
    message: str = ""  # the Status message of the error (default: says it is an injected fault)

    def __post_init__(self) -> None:
        if not self.status and not self.delay:
            raise ValueError(f"fault rule for {self.path!r} does nothing: give status (e.g. 503) or delay")
        re.compile(self.path)


class Faults:
    """The active fault rules of one server (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: dict[FaultRule, int] = {}  # rule -> times fired
        self._released: dict[FaultRule, threading.Event] = {}  # hold rules -> their release

    def add(self, rule: FaultRule) -> FaultRule:
        """Activate ``rule``; returns it as the handle for ``remove``."""
        with self._lock:
            self._rules[rule] = 0
            if rule.hold:
                self._released[rule] = threading.Event()
        return rule

    def release(self, rule: FaultRule) -> None:
        """Let the requests a hold rule holds (and any it would hold later) be served."""
        with self._lock:
            event = self._released.get(rule)
        if event is not None:
            event.set()

    def remove(self, rule: FaultRule) -> None:
        """Deactivate ``rule`` (no error if it already ran out)."""
        with self._lock:
            self._rules.pop(rule, None)
            event = self._released.pop(rule, None)
        if event is not None:
            event.set()  # a removed rule holds nothing any more

    def clear(self) -> None:
        """Deactivate every rule."""
        with self._lock:
            self._rules.clear()
            events, self._released = list(self._released.values()), {}
        for event in events:
            event.set()

    def acting(self, rule: FaultRule) -> bool:
        """Whether ``rule`` still answers requests: added, not removed, and not run out of its ``times``."""
        with self._lock:
            fired = self._rules.get(rule)
        return fired is not None and (not rule.times or fired < rule.times)

    def installed(self, rule: FaultRule) -> bool:
        """Whether ``rule`` was added and not removed (it may have run out of its ``times``)."""
        with self._lock:
            return rule in self._rules

    def fired(self, rule: FaultRule) -> int:
        """How often ``rule`` fired so far."""
        with self._lock:
            return self._rules.get(rule, rule.times)

    def match(self, method: str, path: str) -> FaultRule | None:
        """The first active rule for this request, counted as fired."""
        with self._lock:
            for rule, fired in self._rules.items():
                if (not rule.methods or method in rule.methods) and re.search(rule.path, path):
                    if rule.times and fired >= rule.times:
                        continue
                    self._rules[rule] = fired + 1
                    return rule
        return None

    async def _held(self, rule: FaultRule) -> None:
        with self._lock:
            event = self._released.get(rule)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + rule.delay
        while event is not None and not event.is_set() and loop.time() < deadline:
            await asyncio.sleep(0.01)

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        """An aiohttp middleware applying the rules before any handler."""

        @web.middleware
        async def apply_faults(request: web.Request, handler: Callable[..., Awaitable[web.StreamResponse]]
                               ) -> web.StreamResponse:
            rule = self.match(request.method, request.path)
            if rule is not None:
                if rule.hold:
                    # the whole request first, as an API server has it when it starts on it: a request whose
                    # client gave up while it was held is still served (a create the client never heard of)
                    await request.read()
                    await self._held(rule)
                elif rule.delay:
                    await asyncio.sleep(rule.delay)
                if rule.status:
                    err = ApiError(rule.status, REASONS.get(rule.status, "InternalError"),
                                   rule.message or f"injected fault on {request.method} {request.path} (sandbox "
                                   "fault rule)",
                                   retry_after=1 if rule.status in (429, 503) else 0)
                    headers = {"Retry-After": "1"} if err.retry_after else None
                    return web.json_response(err.status(), status=rule.status, headers=headers)
            return await handler(request)

        return apply_faults
