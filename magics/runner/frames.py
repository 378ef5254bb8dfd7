"""The runner's wire format: one framed event per line, encoded by the runner and decoded by the engine.

A frame is ``\\x1egpuo <nonce> <seq> <kind> <payload>\\n``: the nonce is a per-run secret from the bundle, so
text a cell prints can never pass for a frame (the runner captures the cell's stdout and re-sends it inside
``stream`` frames, JSON-escaped). ``seq`` counts from 0 per runner process, so a reader that resumes a log
stream drops what it has already seen. A line never exceeds :data:`MAX_FRAME_BYTES` (container runtimes
split longer log lines); a larger payload travels as ``part`` frames that the decoder joins again.

The engine imports this module as ``gpu_offload.magics.runner.frames``. The encoder lives in
:mod:`.wire` (re-exported here) so that a runner's cold start does not pay for building the event classes
it never decodes.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .wire import MARK, MAX_FRAME_BYTES, FrameEncoder, check_nonce

__all__ = [
    "MARK",
    "MAX_FRAME_BYTES",
    "DisplayData",
    "Done",
    "Error",
    "Event",
    "FrameDecoder",
    "FrameEncoder",
    "GpuSample",
    "Hello",
    "Metrics",
    "Noise",
    "Outputs",
    "RunnerWarning",
    "Status",
    "Stream",
    "UnknownFrame",
    "check_nonce",
]

_FRAME_RE = re.compile(r"\x1egpuo ([0-9a-f]{32}) (0|[1-9][0-9]*) ([a-z_]+) (.*)\Z", re.DOTALL)


# ---------------------------------------------------------------------------------------------------------
# Decoded events (engine side)


@dataclass(frozen=True)
class Hello:
    """First frame of a runner: who is running the cells."""

    seq: int
    python: str
    """The runner's full Python version, e.g. ``3.11.7``."""
    pid: int
    gpus: tuple[str, ...]
    """Names of the GPUs the runner sees; empty on CPU."""
    session: bool


@dataclass(frozen=True)
class Status:
    """Progress of the run, e.g. ``loading inputs``, ``running``, ``sending outputs``."""

    seq: int
    state: str


@dataclass(frozen=True)
class Stream:
    """Text the cell (or a C extension or subprocess of it) wrote to stdout or stderr."""

    seq: int
    name: str
    """``stdout`` or ``stderr``."""
    text: str


@dataclass(frozen=True)
class DisplayData:
    """A rich output: a MIME bundle as Jupyter's ``display_data`` message carries it."""

    seq: int
    data: Mapping[str, Any]
    """MIME type to content; binary content is base64 text."""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Error:
    """The cell (or the runner on its behalf) failed; the traceback points at cell lines."""

    seq: int
    ename: str
    evalue: str
    traceback: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunnerWarning:
    """Something the user should know that did not stop the run (an output skipped, a tensor moved)."""

    seq: int
    text: str


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment, as NVML reports it."""

    index: int
    name: str
    util: float | None
    """Utilization in percent (``None``: the board does not report it; likewise below)."""
    mem_used: int | None
    """Bytes."""
    mem_total: int | None
    """Bytes."""
    temp: float | None
    """Degrees Celsius."""
    power: float | None
    """Watts."""


@dataclass(frozen=True)
class Metrics:
    """GPU metrics sampled while the cell runs, or once a note that no GPU is visible."""

    seq: int
    gpu: tuple[GpuSample, ...]
    note: str | None = None


@dataclass(frozen=True)
class Outputs:
    """The variables the cell sends back, as a pickle plus out-of-band buffer references."""

    seq: int
    names: tuple[str, ...]
    pickle: Any
    """Base64 text of the main pickle, or a buffer reference dict (see ``buffers``)."""
    buffers: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Done:
    """Last frame of a run: ``ok``, ``error`` or ``interrupted``."""

    seq: int
    status: str
    elapsed: float


@dataclass(frozen=True)
class UnknownFrame:
    """A well-formed frame of a kind this version does not know (kept for forward compatibility)."""

    seq: int
    kind: str
    payload: Any


@dataclass(frozen=True)
class Noise:
    """A line that is not one of this run's frames (image banners, interpreter chatter); diagnostics only."""

    line: str
    reason: str


Event = (
    Hello
    | Status
    | Stream
    | DisplayData
    | Error
    | RunnerWarning
    | Metrics
    | Outputs
    | Done
    | UnknownFrame
    | Noise
)
"""Anything :meth:`FrameDecoder.feed` returns."""


def _gpu_sample(raw: Mapping[str, Any]) -> GpuSample:
    def number(key: str, kind: type[float] | type[int]) -> Any:
        value = raw.get(key)
        return None if value is None else kind(value)

    return GpuSample(
        index=int(raw["index"]),
        name=str(raw["name"]),
        util=number("util", float),
        mem_used=number("mem_used", int),
        mem_total=number("mem_total", int),
        temp=number("temp", float),
        power=number("power", float),
    )


_BUILDERS: dict[str, Callable[[int, Mapping[str, Any]], Event]] = {
    "hello": lambda s, p: Hello(
        s, str(p["python"]), int(p["pid"]), tuple(p.get("gpus", ())), bool(p.get("session", False))
    ),
    "status": lambda s, p: Status(s, str(p["state"])),
    "stream": lambda s, p: Stream(s, str(p["name"]), str(p["text"])),
    "display_data": lambda s, p: DisplayData(s, dict(p["data"]), dict(p.get("metadata") or {})),
    "error": lambda s, p: Error(
        s, str(p["ename"]), str(p.get("evalue", "")), tuple(str(x) for x in p.get("traceback", ()))
    ),
    "warning": lambda s, p: RunnerWarning(s, str(p["text"])),
    "metrics": lambda s, p: Metrics(s, tuple(_gpu_sample(g) for g in p.get("gpu", ())), p.get("note")),
    "outputs": lambda s, p: Outputs(
        s, tuple(p["names"]), p["pickle"], tuple(dict(b) for b in p.get("buffers", ()))
    ),
    "done": lambda s, p: Done(s, str(p["status"]), float(p.get("elapsed", 0.0))),
}


class FrameDecoder:
    """Turns the runner's stdout (bytes or text, in chunks of any size) into events.

    Frames with ``seq <= last_seen`` are dropped, so a resumed log stream neither loses nor repeats events:
    keep feeding the same decoder after a resume (it also holds the ``part`` frames of an unfinished large
    event; a new decoder made with ``last_seen=`` would not have them).
    """

    def __init__(self, nonce: str, last_seen: int = -1) -> None:
        self.nonce = check_nonce(nonce)
        self.last_seen = last_seen
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._parts: dict[int, list[str]] = {}

    def feed(self, data: bytes | str) -> list[Event]:
        """Decode a chunk of output; a trailing partial line waits for the next chunk or :meth:`close`."""
        text = self._text.decode(data) if isinstance(data, bytes) else data
        if not text:
            return []
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        events: list[Event] = []
        for line in lines:
            events.extend(self.feed_line(line))
        return events

    def close(self) -> list[Event]:
        """End of stream: decode what is left (a last line without newline)."""
        rest = self._pending + self._text.decode(b"", final=True)
        self._pending = ""
        return self.feed_line(rest) if rest else []

    def feed_line(self, line: str) -> list[Event]:
        """Decode one line (without its newline); returns no event for a duplicate or an incomplete part."""
        line = line.removesuffix("\r")
        match = _FRAME_RE.match(line)
        if match is None:
            return [Noise(line, "not a frame")]
        nonce, seq_text, kind, payload_text = match.groups()
        if nonce != self.nonce:
            return [Noise(line, "frame of another run (nonce differs)")]
        seq = int(seq_text)
        if seq <= self.last_seen:
            return []
        self.last_seen = seq
        try:
            payload = json.loads(payload_text)
        except ValueError as exc:
            return [Noise(line, f"frame payload is not JSON: {exc}")]
        if kind == "part":
            return self._part(seq, line, payload)
        return [self._build(seq, kind, payload, line)]

    def _part(self, seq: int, line: str, payload: Any) -> list[Event]:
        try:
            part_id, kind, chunk, last = payload["id"], payload["kind"], payload["chunk"], payload["last"]
        except (KeyError, TypeError):
            return [Noise(line, "part frame without id, kind, chunk and last")]
        chunks = self._parts.setdefault(part_id, [])
        chunks.append(chunk)
        if not last:
            return []
        del self._parts[part_id]
        joined = "".join(chunks)
        try:
            whole = json.loads(joined)
        except ValueError as exc:
            return [Noise(joined[:200], f"reassembled {kind} frame is not JSON: {exc}")]
        return [self._build(seq, kind, whole, joined[:200])]

    @staticmethod
    def _build(seq: int, kind: str, payload: Any, line: str) -> Event:
        builder = _BUILDERS.get(kind)
        if builder is None:
            return UnknownFrame(seq, kind, payload)
        try:
            return builder(seq, payload)
        except (KeyError, TypeError, ValueError) as exc:
            return Noise(line, f"{kind} frame lacks or mistypes a field: {exc!r}")
