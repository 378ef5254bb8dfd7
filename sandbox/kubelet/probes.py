"""Container probes as a kubelet runs them: ``exec``, ``tcpSocket`` and ``httpGet``.

Timing and thresholds follow the Probe API: the first check after ``initialDelaySeconds``, then one every
``periodSeconds`` (default 10), each bounded by ``timeoutSeconds`` (default 1); ``successThreshold``
(default 1) successes in a row make a container ready, ``failureThreshold`` (default 3) failures in a row
make it unready (readiness) or get it killed and restarted per the pod's restartPolicy (liveness).
``tcpSocket`` and ``httpGet`` go to the pod's IP unless ``host`` is set, as a kubelet's prober does; a
named port is looked up in the container's ``ports``; an HTTP status from 200 to 399 succeeds, and a
redirect is not followed. An ``exec`` probe succeeds on exit code 0.

A ``startupProbe`` runs first: until it succeeds the container is neither started nor ready and the other
probes wait; once it failed ``failureThreshold`` times the container is killed and restarted. Failure
messages read like a kubelet's events: ``dial tcp 10.0.0.5:8080: connect: connection refused``, ``HTTP
probe failed with statuscode: 503``, or an exec probe's own output.

Left out: ``grpc`` probes; ``terminationGracePeriodSeconds`` on a probe (the pod's grace period applies).
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

Exec = Callable[[list[str], float], Awaitable[tuple[int, str]]]
"""``run(command, timeout)`` -> exit code and output of ``command`` run in the container."""


@dataclass(frozen=True)
class Probe:
    """One probe of a container spec, with the API's defaults filled in."""

    kind: str
    """``startup``, ``readiness`` or ``liveness`` (as events name them: "Readiness probe failed")."""
    handler: Mapping[str, Any]
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int


def parse(kind: str, spec: Mapping[str, Any] | None) -> Probe | None:
    """The probe ``spec`` (a container's ``readinessProbe``/``livenessProbe``), or None if absent."""
    if not spec:
        return None
    return Probe(kind, spec, float(spec.get("initialDelaySeconds", 0)), float(spec.get("periodSeconds", 10)),
                 float(spec.get("timeoutSeconds", 1)), int(spec.get("successThreshold", 1)),
                 int(spec.get("failureThreshold", 3)))


def _port(value: Any, container: Mapping[str, Any]) -> int:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"port {value!r} is not a number and names no port of the container")


def _go_error(exc: BaseException) -> str:
    # Go's wording of a failed dial, which is what users search for
    if isinstance(exc, asyncio.TimeoutError) or getattr(exc, "errno", None) == errno.ETIMEDOUT:
        return "i/o timeout"
    code = getattr(exc, "errno", None)
    return f"connect: {os.strerror(code).lower()}" if isinstance(code, int) else str(exc)


async def _tcp(host: str, port: int, timeout: float) -> str:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"dial tcp {host}:{port}: {_go_error(exc)}"
    writer.close()
    return ""


def _http_get(host: str, port: int, action: Mapping[str, Any], timeout: float) -> str:
    scheme = str(action.get("scheme", "HTTP")).upper()
    path = str(action.get("path") or "/")
    if scheme == "HTTPS":
        import ssl  # a kubelet does not verify the pod's certificate
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl._create_unverified_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"User-Agent": "kube-probe/1.36", "Accept": "*/*"}
    headers.update({h["name"]: h["value"] for h in action.get("httpHeaders") or []})
    try:
        conn.request("GET", path, headers=headers)
        code = conn.getresponse().status
    except OSError as exc:
        return f'Get "{scheme.lower()}://{host}:{port}{path}": dial tcp {host}:{port}: {_go_error(exc)}'
    finally:
        conn.close()
    return "" if 200 <= code < 400 else f"HTTP probe failed with statuscode: {code}"


async def check(probe: Probe, container: Mapping[str, Any], pod_ip: str, run: Exec) -> tuple[bool, str]:
    """Run ``probe`` once: whether it passed, and else why (the event's message)."""
    handler = probe.handler
    try:
        if "exec" in handler:
            code, output = await run([str(c) for c in (handler["exec"].get("command") or [])], probe.timeout)
            return code == 0, output  # a kubelet reports an exec probe's failure by its output
        if "tcpSocket" in handler:
            action = handler["tcpSocket"]
            why = await _tcp(action.get("host") or pod_ip, _port(action.get("port"), container), probe.timeout)
        elif "httpGet" in handler:
            action = handler["httpGet"]
            why = await asyncio.to_thread(_http_get, action.get("host") or pod_ip,
                                          _port(action.get("port"), container), action, probe.timeout)
        else:
            why = "probe has no exec, tcpSocket or httpGet handler (grpc is not emulated)"
    except asyncio.TimeoutError:
        why = f"command timed out after {probe.timeout:g}s"
    except (ValueError, OSError) as exc:
        why = str(exc)
    return not why, why


async def run_probe(probe: Probe, container: Mapping[str, Any], pod_ip: str, run: Exec,
                    on_failure: Callable[[str], None], on_state: Callable[[bool], Awaitable[None]],
                    until_decided: bool = False) -> bool:
    """Probe until cancelled: ``on_failure(message)`` after each failed check (the kubelet's Unhealthy
    event), ``on_state(ok)`` each time a threshold flips the result (ready/unready, or alive/dead).

    With ``until_decided`` (a startup probe), return the first verdict instead of going on.
    """
    await asyncio.sleep(probe.initial_delay)
    successes = failures = 0
    state: bool | None = None
    while True:
        ok, message = await check(probe, container, pod_ip, run)
        successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
        if not ok:
            on_failure(message)
        if (not ok and failures >= probe.failure_threshold and state is not False) or (
                ok and successes >= probe.success_threshold and state is not True):
            state = ok
            await on_state(ok)
            if until_decided:
                return ok
        await asyncio.sleep(probe.period)


@dataclass(frozen=True)
class Hooks:
    """What probing one container run may do to it (the pod worker provides them)."""

    run: Exec
    event: Callable[[str, str, str], None]
    """``event(type, reason, message)`` about the container."""
    set_started: Callable[[bool], None]
    set_ready: Callable[[bool], None]
    kill: Callable[[str], Awaitable[None]]
    """Stop the container because ``kind`` probe failed (it is then restarted per restartPolicy)."""


async def supervise(container: Mapping[str, Any], pod_ip: str, hooks: Hooks) -> None:
    """Every probe of one run of ``container``, startup first; returns when nothing is left to probe."""

    def failed(kind: str) -> Callable[[str], None]:
        return lambda message: hooks.event("Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {message}")

    def flipped(kind: str) -> Callable[[bool], Awaitable[None]]:
        async def on_state(ok: bool) -> None:
            if kind == "readiness":
                hooks.set_ready(ok)
            elif not ok:
                await hooks.kill(kind)
        return on_state

    startup = parse("startup", container.get("startupProbe"))
    if startup is not None:
        if not await run_probe(startup, container, pod_ip, hooks.run, failed("startup"),
                               flipped("startup"), until_decided=True):
            return
        hooks.set_started(True)
    others = [p for p in (parse("readiness", container.get("readinessProbe")),
                          parse("liveness", container.get("livenessProbe"))) if p is not None]
    await asyncio.gather(*(run_probe(p, container, pod_ip, hooks.run, failed(p.kind),
                                     flipped(p.kind)) for p in others))
