"""``pods/attach`` and ``pods/exec`` over the Kubernetes websocket channel protocol.

Protocols ``v5.channel.k8s.io`` and ``v4.channel.k8s.io``: every binary frame starts with a channel byte
(0 stdin, 1 stdout, 2 stderr, 3 error: a ``Status`` JSON sent once at the end, 4 resize: ``{"Width": w,
"Height": h}``); v5 adds frame ``[255, channel]`` to close a channel (the client closing stdin).

Extension point (part 2's kubelet): a *stream provider* runs the session. Register one per node name, or
one default (``node=None``)::

    async def provider(req: StreamRequest, io: StreamIO) -> int:   # returns the exit code
        data = await io.read_stdin()      # bytes, or None once stdin is closed
        await io.write_stdout(b"...")
        return 0

    api.streams.register(provider, node="donor-1")

Raise an ``ApiError`` before the first write to refuse (e.g. container not running): the client gets it
as the ``Status`` on channel 3. The websocket is closed once the provider returns.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from .errors import ApiError
from .portforward import Connector

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


@dataclass(frozen=True)
class StreamRequest:
    """One attach or exec session as the client asked for it."""

    kind: str  # "attach" or "exec"
    namespace: str
    pod: str
    container: str
    command: tuple[str, ...]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool
    node: str


@dataclass(frozen=True)
class Resize:
    """A terminal size change sent on channel 4."""

    width: int
    height: int


class StreamIO:
    """The provider's side of one websocket session."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws
        self._stdin: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.resizes: asyncio.Queue[Resize] = asyncio.Queue()

    async def read_stdin(self) -> bytes | None:
        """The next chunk the client wrote to stdin; None once the client closed stdin or disconnected."""
        return await self._stdin.get()

    async def write_stdout(self, data: bytes) -> None:
        """Send bytes to the client's stdout channel."""
        await self._send(STDOUT, data)

    async def write_stderr(self, data: bytes) -> None:
        """Send bytes to the client's stderr channel."""
        await self._send(STDERR, data)

    async def _send(self, channel: int, data: bytes) -> None:
        if not self._ws.closed:
            await self._ws.send_bytes(bytes([channel]) + data)

    def _feed(self, raw: bytes) -> None:
        if not raw:
            return
        channel, payload = raw[0], raw[1:]
        if channel == STDIN and payload:
            self._stdin.put_nowait(payload)
        elif channel == RESIZE:
            size = json.loads(payload or b"{}")
            self.resizes.put_nowait(Resize(int(size.get("Width", 0)), int(size.get("Height", 0))))
        elif channel == CLOSE and payload[:1] == bytes([STDIN]):
            self._stdin.put_nowait(None)

    async def pump(self) -> None:
        """Read client frames until the websocket closes (then stdin reads return None)."""
        async for msg in self._ws:
            if msg.type == WSMsgType.BINARY:
                self._feed(msg.data)
            elif msg.type == WSMsgType.TEXT:
                self._feed(msg.data.encode())
        self._stdin.put_nowait(None)


StreamProvider = Callable[[StreamRequest, StreamIO], Awaitable[int]]


def exit_status(code: int, command: tuple[str, ...]) -> dict[str, Any]:
    """The channel-3 Status the kubelet sends when a session ends with ``code``."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {}, "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {list(command)}, "
                   f"exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class StreamProviders:
    """Which provider serves the pods of which node."""

    def __init__(self) -> None:
        self._by_node: dict[str | None, StreamProvider] = {}
        self._forwarders: dict[str | None, Connector] = {}

    def register(self, provider: StreamProvider, node: str | None = None) -> None:
        """Serve attach/exec for pods bound to ``node`` (None: every node without its own provider)."""
        self._by_node[node] = provider

    def unregister(self, node: str | None = None) -> None:
        """Stop serving ``node``."""
        self._by_node.pop(node, None)

    def find(self, node: str) -> StreamProvider | None:
        """The provider for pods on ``node``, if any."""
        return self._by_node.get(node) or self._by_node.get(None)

    def register_port_forward(self, connect: Connector, node: str | None = None) -> None:
        """Serve ``pods/portforward`` for pods bound to ``node`` (None: every node) with ``connect``."""
        self._forwarders[node] = connect

    def find_port_forward(self, node: str) -> Connector | None:
        """The port-forward connector for pods on ``node``, if any."""
        return self._forwarders.get(node) or self._forwarders.get(None)


async def serve(request: web.Request, provider: StreamProvider, req: StreamRequest) -> web.WebSocketResponse:
    """Upgrade to a channel websocket and run ``provider`` on it until it returns."""
    ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
    await ws.prepare(request)
    io = StreamIO(ws)
    pump = asyncio.create_task(io.pump())
    try:
        try:
            code = await provider(req, io)
            status = exit_status(code, req.command)
        except ApiError as exc:
            status = exc.status()
        await io._send(ERROR, json.dumps(status).encode())
    finally:
        await ws.close()
        pump.cancel()
    return ws
