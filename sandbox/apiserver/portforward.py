"""``pods/portforward`` over a websocket, as the kubelet serves it with protocol ``v4.channel.k8s.io``.

The client names the ports in the query (``?ports=8888&ports=9000`` or ``ports=8888,9000``). Port number
*i* (from 0) gets two channels: data ``2i`` and error ``2i+1``. The server first sends, on each of them, a
frame holding the port number (two bytes, little-endian); then every frame is the channel byte and bytes
of the TCP stream; a connection that fails is reported as text on the error channel. The websocket closes
once the pod side of every port closed (the official client's ``kubernetes.stream.portforward`` then ends
its local sockets too).

The connection itself is made by a *connector* the kubelet registers (``api.streams.register_port_forward``),
so this module knows nothing of where a pod's ports live.

Left out: the SPDY upgrade and the websocket-tunnelled SPDY (``portforward.k8s.io``, kubectl 1.30+), so
``kubectl port-forward`` does not work; the base64 channel variant.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from .errors import ApiError, bad_request

PROTOCOLS = ("v4.channel.k8s.io",)

Connector = Callable[[str, str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""``connect(namespace, pod, port)`` -> an open TCP stream to the pod's port (raise OSError or ApiError)."""


@dataclass(frozen=True)
class ForwardRequest:
    """What the client asked to forward."""

    namespace: str
    pod: str
    ports: tuple[int, ...]


def parse_ports(values: Sequence[str]) -> tuple[int, ...]:
    """The ``ports`` query values (each may list several, comma-separated); 400 if none or one is bad."""
    ports: list[int] = []
    for value in values:
        for part in value.split(","):
            if not part.strip().isdigit() or not 0 < int(part) < 65536:
                raise bad_request(f"invalid port {part!r}: ports must be numbers from 1 to 65535")
            ports.append(int(part))
    if not ports:
        raise bad_request("pods/portforward needs at least one port: add ?ports=<number>")
    return tuple(ports)


async def _pump(reader: asyncio.StreamReader, ws: web.WebSocketResponse, channel: int) -> None:
    while data := await reader.read(65536):
        if ws.closed:
            return
        await ws.send_bytes(bytes([channel]) + data)


async def serve(request: web.Request, connect: Connector, req: ForwardRequest) -> web.WebSocketResponse:
    """Upgrade to the channel websocket and copy bytes between it and the pod's ports until done."""
    ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
    await ws.prepare(request)
    writers: dict[int, asyncio.StreamWriter] = {}
    pumps: list[asyncio.Task[None]] = []
    try:
        for index, port in enumerate(req.ports):
            prefix = port.to_bytes(2, "little")
            await ws.send_bytes(bytes([2 * index]) + prefix)
            await ws.send_bytes(bytes([2 * index + 1]) + prefix)
        for index, port in enumerate(req.ports):
            try:
                reader, writers[index] = await connect(req.namespace, req.pod, port)
            except (OSError, ApiError) as exc:
                why = exc.message if isinstance(exc, ApiError) else str(exc)
                await ws.send_bytes(bytes([2 * index + 1]) + (
                    f"error forwarding port {port} to pod {req.namespace}/{req.pod}: {why}").encode())
                continue
            pumps.append(asyncio.ensure_future(_pump(reader, ws, 2 * index)))
        if pumps:
            await _copy_in(ws, writers, pumps)
    finally:
        for task in pumps:
            task.cancel()
        for writer in writers.values():
            writer.close()
        await ws.close()
    return ws


async def _copy_in(ws: web.WebSocketResponse, writers: dict[int, asyncio.StreamWriter],
                   pumps: list[asyncio.Task[None]]) -> None:
    # client frames to the pod until the client leaves or the pod closed every port
    done = asyncio.ensure_future(asyncio.wait(pumps))
    while not done.done():
        receive = asyncio.ensure_future(ws.receive())
        await asyncio.wait([receive, done], return_when=asyncio.FIRST_COMPLETED)
        if not receive.done():
            receive.cancel()
            break
        msg = receive.result()
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            break
        data = msg.data if msg.type == WSMsgType.BINARY else str(msg.data).encode()
        writer = writers.get(data[0] // 2) if data and data[0] % 2 == 0 else None
        if writer is not None and len(data) > 1:
            with contextlib.suppress(ConnectionError):
                writer.write(data[1:])
                await writer.drain()
    done.cancel()
