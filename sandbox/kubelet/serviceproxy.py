"""ClusterIPs that reach their endpoints: a userspace proxy, as kube-proxy's first mode was.

Where pods have their own network namespaces, each TCP port of a Service with a ClusterIP and a selector
gets a listener on ``<clusterIP>:<port>``; the ClusterIP is an address of the sandbox's bridge, so pods
(whose default route is the bridge) and the host reach it. A connection goes to a random ready endpoint
(``targetPort``: a number, a container port's name, or the port itself). Left out: UDP and SCTP ports,
session affinity, NodePorts and LoadBalancers, and a ClusterIP two sandboxes on one machine both hand out
(the second one cannot listen on it and says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from .podnames import published, selects

LOG = logging.getLogger(__name__)
Key = tuple[str, int]


def target_port(pod: Mapping[str, Any], port: Mapping[str, Any]) -> int | None:
    """The pod port a Service port sends to (None: a named port the pod does not have)."""
    target = port.get("targetPort", port["port"])
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for declared in container.get("ports") or []:
            if declared.get("name") == target:
                return int(declared["containerPort"])
    return None


def backends(services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[Key, list[Key]]:
    """``(clusterIP, port)`` -> the ``(pod IP, pod port)`` of its ready endpoints (``podnames.published``), for
    TCP ports."""
    pods = list(pods)
    out: dict[Key, list[Key]] = {}
    for svc in services:
        spec = svc.get("spec") or {}
        ip = spec.get("clusterIP")
        if not ip or ip == "None" or not spec.get("selector"):
            continue
        for port in spec.get("ports") or []:
            if port.get("protocol", "TCP") == "TCP":
                out[(ip, int(port["port"]))] = [(p["status"]["podIP"], t) for p in pods if selects(svc, p)
                                                and published(svc, p) and (t := target_port(p, port))]
    return out


class ServiceProxy:
    """Listeners on ClusterIPs, kept in line with the Services and pods."""

    def __init__(self, add_address: Any) -> None:
        self._add_address = add_address
        self._servers: dict[Key, asyncio.Server] = {}
        self._backends: dict[Key, list[Key]] = {}
        self._failed: set[Key] = set()

    async def sync(self, wanted: dict[Key, list[Key]]) -> None:
        """Listen on every key of ``wanted`` (and no other), sending to its endpoints."""
        self._backends = wanted
        for key in [k for k in self._servers if k not in wanted]:
            self._servers.pop(key).close()
        for key in [k for k in wanted if k not in self._servers and k not in self._failed]:
            try:
                await asyncio.to_thread(self._add_address, key[0])
                self._servers[key] = await asyncio.start_server(self._relay_for(key), key[0], key[1])
            except OSError as exc:
                self._failed.add(key)
                LOG.warning("sandbox: Service address %s:%s is not reachable: %s", key[0], key[1], exc)

    def _relay_for(self, key: Key) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._relay(key, reader, writer)
        return relay

    async def _relay(self, key: Key, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        endpoints = self._backends.get(key) or []
        try:
            if not endpoints:
                return  # as kube-proxy with no endpoint: the connection is refused (closed here)
            up_reader, up_writer = await asyncio.open_connection(*random.choice(endpoints))
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            writer.close()

    def close(self) -> None:
        """Stop listening."""
        for server in self._servers.values():
            server.close()
        self._servers.clear()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    finally:
        with contextlib.suppress(OSError):
            sink.write_eof() if sink.can_write_eof() else sink.close()
