"""The runner's wire format: one framed event per line, encoded by the runner and decoded by the engine.

A frame is ``\\x1egpuo <nonce> <seq> <run> <rank> <kind> <payload>\\n``: the nonce is a per-run secret from
the bundle, so text a cell prints can never pass for a frame (the runner captures the cell's stdout and
re-sends it inside ``stream`` frames, JSON-escaped). ``seq`` counts from 0 per runner process, so a reader
that resumes a log stream drops what it has already seen. ``run`` names the run a frame belongs to, so a
session's reader drops what a previous run left behind instead of taking it for the current run's. A line never exceeds :data:`MAX_FRAME_BYTES` (container runtimes
split longer log lines); a larger payload travels as ``part`` frames that the decoder joins again.

The engine imports this module as ``gpu_offload.runner.frames``. The encoder lives in
:mod:`.wire` (re-exported here) so that a runner's cold start does not pay for building the event classes
it never decodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .lines import LineSplitter, Overlong
from .wire import MARK, MAX_FRAME_BYTES, NO_RUN, FrameEncoder, check_nonce, run_token

__all__ = [
    "MARK",
    "MAX_FRAME_BYTES",
    "DisplayData",
    "Done",
    "Error",
    "Event",
    "FrameDecoder",
    "FrameEncoder",
    "FrameError",
    "GpuSample",
    "Hello",
    "Metrics",
    "Noise",
    "Outputs",
    "RunnerWarning",
    "Status",
    "Stopping",
    "Stream",
    "UnknownFrame",
    "check_nonce",
    "run_token",
]

_FRAME_RE = re.compile(
    r"\x1egpuo ([0-9a-f]{32}) (0|[1-9][0-9]{0,17}) (-|[A-Za-z0-9][A-Za-z0-9_.-]{0,63}) (0|[1-9][0-9]{0,5}) "
    r"([a-z_]{1,40}) (.*)\Z",
    re.DOTALL,
)
MAX_LINE_BYTES = 4 * MAX_FRAME_BYTES
"""Longest line the decoder buffers; a longer one is no frame (the encoder never writes one) and is cut."""
MAX_EVENT_BYTES = 1 << 30
"""Largest event reassembled from ``part`` frames; kubernetes runs without object storage send their
outputs inline, so this bounds the largest output such a run can return."""
MAX_DEPTH = 100
"""Deepest nesting of lists and objects a payload may have (IPython and the notebook recurse on it)."""


# ---------------------------------------------------------------------------------------------------------
# Decoded events (engine side)


@dataclass(frozen=True)
class _Frame:
    """What every decoded frame carries: its sequence number and the rank it came from."""

    seq: int
    rank: int = field(default=0, kw_only=True)
    """The rank of a distributed run the frame came from (0 outside one)."""


@dataclass(frozen=True)
class Hello(_Frame):
    """First frame of a runner: who is running the cells."""

    python: str
    """The runner's full Python version, e.g. ``3.11.7``."""
    pid: int
    gpus: tuple[str, ...]
    """Names of the GPUs the runner sees; empty on CPU."""
    session: bool
    boot: float | None = field(default=None, kw_only=True)
    """Seconds from the runner process's start to this frame, as the runner measured them (``None``: it
    could not tell, or an older runner)."""


@dataclass(frozen=True)
class Status(_Frame):
    """Progress of the run, e.g. ``loading inputs``, ``running``, ``sending outputs``."""

    state: str
    imports: float | None = field(default=None, kw_only=True)
    """On the ``running`` status: seconds the runner spent importing the cell's modules."""


@dataclass(frozen=True)
class Stream(_Frame):
    """Text the cell (or a C extension or subprocess of it) wrote to stdout or stderr."""

    name: str
    """``stdout`` or ``stderr``."""
    text: str


@dataclass(frozen=True)
class DisplayData(_Frame):
    """A rich output: a MIME bundle as Jupyter's ``display_data`` message carries it."""

    data: Mapping[str, Any]
    """MIME type to content; binary content is base64 text."""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Error(_Frame):
    """The cell (or the runner on its behalf) failed; the traceback points at cell lines."""

    ename: str
    evalue: str
    traceback: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunnerWarning(_Frame):
    """Something the user should know that did not stop the run (an output skipped, a tensor moved)."""

    text: str


@dataclass(frozen=True)
class Stopping(_Frame):
    """The runner's pod is being stopped: SIGTERM reached it while a cell ran (a preemption, a drain, an eviction),
    said at once, before the cell's interruption and the session's checkpoint."""

    signal: str
    """The signal's name as the runner says it (a donor's words: shown sanitized and bounded)."""
    session: bool
    """The runner is a session's (its state outlives the pod if it is checkpointed)."""
    checkpoint: bool
    """The kernel armed a checkpoint for SIGTERM: the runner writes the session's state now if it changed."""


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
class Metrics(_Frame):
    """GPU metrics sampled while the cell runs, or once a note that no GPU is visible."""

    gpu: tuple[GpuSample, ...]
    note: str | None = None


@dataclass(frozen=True)
class Outputs(_Frame):
    """The variables the cell sends back, as a pickle plus out-of-band buffer references, or a safe container."""

    names: tuple[str, ...]
    pickle: Any
    """Base64 text of the main pickle (or safe container), or a buffer reference dict (see ``buffers``)."""
    buffers: tuple[Mapping[str, Any], ...]
    format: str = "pickle"
    """``pickle``, or ``safe``: a container of :mod:`.safe` (from a runner on an untrusted cluster)."""


@dataclass(frozen=True)
class Done(_Frame):
    """Last frame of a run: ``ok``, ``error`` or ``interrupted``."""

    status: str
    elapsed: float
    gpu_peak: int | None = field(default=None, kw_only=True)
    """Bytes PyTorch's allocator held at most on GPU 0 during the run (``torch.cuda.max_memory_allocated``), as
    the runner says; None without torch or a GPU. Only the user's next estimate for the same cell uses it."""


MAX_GPU_PEAK = 1 << 44
"""16 TiB: no GPU holds more; a larger peak is a donor's word not taken."""


@dataclass(frozen=True)
class UnknownFrame(_Frame):
    """A well-formed frame of a kind this version does not know (kept for forward compatibility)."""

    kind: str
    payload: Any


@dataclass(frozen=True)
class FrameError(_Frame):
    """A frame of this run that could not be decoded (bad JSON, too deep, a field missing, too large).

    The run's stream goes on; whatever the frame carried is lost, so the reader should tell the user.
    """

    reason: str
    line: str
    """The start of the offending frame, for diagnostics."""


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
    | Stopping
    | Metrics
    | Outputs
    | Done
    | UnknownFrame
    | FrameError
    | Noise
)
"""Anything :meth:`FrameDecoder.feed` returns."""


def _text(value: Any, what: str) -> str:
    """``value`` if it is text: the fields below reach f-strings, sets and joins, where a donor's dict or list
    would crash the reader or print as something else."""
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not text")
    return value


def _texts(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"{what} is {type(value).__name__}, not a list")
    return tuple(_text(item, f"an item of {what}") for item in value)


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is {type(value).__name__}, not an object")
    return value


def _number(value: Any, kind: type[float] | type[int], what: str) -> Any:
    if type(value) not in (int, float) or (kind is int and type(value) is not int):
        raise TypeError(f"{what} is {type(value).__name__}, not a number")
    return kind(value)


def _gpu_sample(raw: Any) -> GpuSample:
    raw = _mapping(raw, "a GPU sample")

    def number(key: str, kind: type[float] | type[int]) -> Any:
        value = raw.get(key)
        return None if value is None else _number(value, kind, key)

    return GpuSample(
        index=_number(raw["index"], int, "index"),
        name=_text(raw["name"], "name"),
        util=number("util", float),
        mem_used=number("mem_used", int),
        mem_total=number("mem_total", int),
        temp=number("temp", float),
        power=number("power", float),
    )


def _note(value: Any) -> str | None:
    return None if value is None else _text(value, "note")


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{what} is {type(value).__name__}, not true or false")
    return value


# every field is checked for its type here, once: the events' users (the notebook, the shell, the panel,
# `%gpu_offload status`) take them as typed, and a donor writes whatever JSON it likes
_BUILDERS: dict[str, Callable[[int, Mapping[str, Any], int], Event]] = {
    "hello": lambda s, p, r: Hello(
        s, _text(p["python"], "python"), _number(p["pid"], int, "pid"), _texts(p.get("gpus", []), "gpus"),
        _bool(p.get("session", False), "session"), rank=r, boot=_duration(p.get("boot"), "boot"),
    ),
    "status": lambda s, p, r: Status(
        s, _text(p["state"], "state"), rank=r, imports=_duration(p.get("imports"), "imports")
    ),
    "stream": lambda s, p, r: Stream(s, _text(p["name"], "name"), _text(p["text"], "text"), rank=r),
    "display_data": lambda s, p, r: DisplayData(
        s, _mapping(p["data"], "data"), _mapping(p.get("metadata") or {}, "metadata"), rank=r
    ),
    "error": lambda s, p, r: Error(
        s, _text(p["ename"], "ename"), _text(p.get("evalue", ""), "evalue"),
        _texts(p.get("traceback", []), "traceback"), rank=r,
    ),
    "warning": lambda s, p, r: RunnerWarning(s, _text(p["text"], "text"), rank=r),
    "stopping": lambda s, p, r: Stopping(
        s, _text(p.get("signal", "SIGTERM"), "signal"), _bool(p.get("session", False), "session"),
        _bool(p.get("checkpoint", False), "checkpoint"), rank=r,
    ),
    "metrics": lambda s, p, r: Metrics(
        s, tuple(_gpu_sample(g) for g in _list(p.get("gpu", []), "gpu")), _note(p.get("note")), rank=r
    ),
    "outputs": lambda s, p, r: Outputs(
        s, _texts(p["names"], "names"), p["pickle"],
        tuple(_mapping(b, "a buffer reference") for b in _list(p.get("buffers", []), "buffers")),
        _text(p.get("format", "pickle"), "format"), rank=r,
    ),
    "done": lambda s, p, r: Done(
        s, _text(p["status"], "status"), _number(p.get("elapsed", 0.0), float, "elapsed"), rank=r,
        gpu_peak=_peak(p.get("gpu_peak")),
    ),
}


def _peak(value: Any) -> int | None:
    """An optional byte count from 0 to :data:`MAX_GPU_PEAK`."""
    if value is None:
        return None
    peak = _number(value, int, "gpu_peak")
    if not 0 <= peak <= MAX_GPU_PEAK:
        raise ValueError(f"gpu_peak is {peak!r}, not a number of bytes a GPU holds")
    return int(peak)


def _duration(value: Any, what: str) -> float | None:
    """An optional, non-negative, finite number of seconds."""
    if value is None:
        return None
    seconds = _number(value, float, what)
    if not 0.0 <= seconds < 1e9:
        raise ValueError(f"{what} is {seconds!r}, not a number of seconds")
    return seconds


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what} is {type(value).__name__}, not a list")
    return value


class FrameDecoder:
    """Turns the runner's stdout (bytes or text, in chunks of any size) into events; never raises on input.

    Frames with ``seq <= last_seen`` are dropped, so a resumed log stream neither loses nor repeats events:
    keep feeding the same decoder after a resume (it also holds the ``part`` frames of an unfinished large
    event; a new decoder made with ``last_seen=`` would not have them). With a ``run_id`` (or after
    :meth:`expect_run`) frames of any other run are dropped and counted in :attr:`foreign`; frames of no
    run (``hello``) always pass. Work is linear in the input; a line is buffered up to
    :data:`MAX_LINE_BYTES` and a large event up to ``max_event_bytes``.

    ``ranks``: how many ranks the stream may carry (a distributed run's world size; 1 otherwise): a frame
    of another rank is :class:`Noise`. Events carry their frame's rank; each rank's ``part`` frames are
    reassembled apart from the others'.
    """

    def __init__(
        self,
        nonce: str,
        last_seen: int = -1,
        *,
        run_id: str | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        ranks: int = 1,
    ) -> None:
        self.nonce = check_nonce(nonce)
        self.ranks = ranks
        self.last_seen = last_seen
        self.foreign = 0
        """Frames dropped because they belong to another run."""
        self.max_event_bytes = max_event_bytes
        self._run = None if run_id is None else run_token(run_id)
        self._lines = LineSplitter(MAX_LINE_BYTES)
        # per rank: (part id, kind, chunks) of the one large event being reassembled
        self._parts: dict[int, tuple[int, str, list[str]]] = {}
        self._part_bytes = 0
        self._skipping: dict[int, int] = {}  # per rank: the part id of an event dropped as too large

    def expect_run(self, run_id: str | None) -> None:
        """Accept from now on only frames of ``run_id`` (``None``: of any run); drops unfinished parts."""
        self._run = None if run_id is None else run_token(run_id)
        self._parts.clear()
        self._skipping.clear()
        self._part_bytes = 0

    def feed(self, data: bytes | str) -> list[Event]:
        """Decode a chunk of output; a trailing partial line waits for the next chunk or :meth:`close`."""
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        return self._decode(self._lines.feed(raw))

    def close(self) -> list[Event]:
        """End of stream: decode what is left (a last line without newline)."""
        return self._decode(self._lines.close())

    def _decode(self, lines: list[bytes | Overlong]) -> list[Event]:
        events: list[Event] = []
        for line in lines:
            if isinstance(line, Overlong):
                head = line.head.decode("utf-8", "replace")
                events.append(Noise(head, f"line of {line.size} bytes is longer than any frame; dropped"))
            else:
                events.extend(self.feed_line(line.decode("utf-8", "replace")))
        return events

    def feed_line(self, line: str) -> list[Event]:
        """Decode one line (without its newline); returns no event for a duplicate or an incomplete part."""
        try:
            return self._line(line)
        except Exception as exc:  # noqa: BLE001 - a reader must survive any input; the run learns of it
            return [FrameError(self.last_seen, f"the frame decoder failed: {exc!r}", line[:200])]

    def _line(self, line: str) -> list[Event]:
        line = line.removesuffix("\r")
        match = _FRAME_RE.match(line)
        if match is None:
            return [Noise(line[:MAX_LINE_BYTES], "not a frame")]
        nonce, seq_text, run, rank_text, kind, payload_text = match.groups()
        if nonce != self.nonce:
            return [Noise(line, "frame of another run (nonce differs)")]
        rank = int(rank_text)
        if rank >= self.ranks:
            return [Noise(line[:200], f"frame of rank {rank}, outside this run's {self.ranks} rank(s)")]
        seq = int(seq_text)
        if seq <= self.last_seen:
            return []
        self.last_seen = seq
        if self._run is not None and run not in (self._run, NO_RUN):
            self.foreign += 1
            return []
        payload = _parse(payload_text)
        if isinstance(payload, _Bad):
            return [FrameError(seq, f"{kind} frame payload {payload.reason}", line[:200], rank=rank)]
        if kind == "part":
            return self._part(seq, line, payload, rank)
        return [self._build(seq, kind, payload, line, rank)]

    def _part(self, seq: int, line: str, payload: Any, rank: int) -> list[Event]:
        try:
            part_id, kind, chunk, last = payload["id"], payload["kind"], payload["chunk"], payload["last"]
            if not (isinstance(part_id, int) and isinstance(kind, str) and isinstance(chunk, str)):
                raise TypeError("id, kind and chunk must be an integer and two strings")
        except (KeyError, TypeError) as exc:
            return [FrameError(seq, f"part frame without id, kind, chunk and last: {exc}", line[:200], rank=rank)]
        if part_id == self._skipping.get(rank):
            if last:
                del self._skipping[rank]
            return []
        current = self._parts.get(rank)
        dropped: list[Event] = []
        if current is None or current[0] != part_id:
            # a rank's encoder finishes one large event before it starts the next: an older one never ends
            if current is not None:
                dropped.append(FrameError(seq, f"{current[1]} event left unfinished", "", rank=rank))
                self._part_bytes -= sum(len(c) for c in current[2])
            current = self._parts[rank] = (part_id, kind, [])
        chunks = current[2]
        chunks.append(chunk)
        self._part_bytes += len(chunk)
        if self._part_bytes > self.max_event_bytes:
            # bounded over all ranks together: the reader holds at most this much, however many ranks send
            self._part_bytes -= sum(len(c) for c in chunks)
            del self._parts[rank]
            if not last:
                self._skipping[rank] = part_id
            return [*dropped, FrameError(
                seq, f"{kind} event exceeds {self.max_event_bytes} bytes; dropped (send large outputs "
                "through object storage or shared memory)", line[:200], rank=rank)]
        if not last:
            return dropped
        del self._parts[rank]
        self._part_bytes -= sum(len(c) for c in chunks)
        joined = "".join(chunks)
        whole = _parse(joined)
        if isinstance(whole, _Bad):
            return [*dropped, FrameError(seq, f"reassembled {kind} frame {whole.reason}", joined[:200], rank=rank)]
        return [*dropped, self._build(seq, kind, whole, joined[:200], rank)]

    @staticmethod
    def _build(seq: int, kind: str, payload: Any, line: str, rank: int = 0) -> Event:
        builder = _BUILDERS.get(kind)
        if builder is None:
            return UnknownFrame(seq, kind, payload, rank=rank)
        try:
            return builder(seq, payload, rank)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return FrameError(seq, f"{kind} frame lacks or mistypes a field: {exc!r}", line[:200], rank=rank)


@dataclass(frozen=True)
class _Bad:
    reason: str


def _parse(text: str) -> Any:
    """JSON ``text`` as a value, or :class:`_Bad` saying why not (never raises)."""
    try:
        value = json.loads(text)
    except RecursionError:
        return _Bad(f"is nested deeper than {MAX_DEPTH} levels")
    except ValueError as exc:
        return _Bad(f"is not JSON: {exc}")
    # counting brackets is C-fast and spares the walk for nearly every payload
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        return _Bad(f"is nested deeper than {MAX_DEPTH} levels")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
