"""The wire format on its own: what the engine decodes is exactly what the runner encoded."""

from __future__ import annotations

import secrets

import pytest
from gpu_offload.magics.runner.frames import (
    MAX_FRAME_BYTES,
    DisplayData,
    Done,
    FrameDecoder,
    FrameEncoder,
    Hello,
    Metrics,
    Noise,
    Stream,
    UnknownFrame,
)


def encode(nonce: str, *events: tuple[str, dict]) -> list[bytes]:
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    for kind, payload in events:
        encoder.emit(kind, **payload)
    return lines


@pytest.fixture
def nonce() -> str:
    return secrets.token_hex(16)


def test_events_round_trip_as_typed_values(nonce: str) -> None:
    lines = encode(
        nonce,
        ("hello", {"python": "3.11.7", "pid": 42, "gpus": ["A100"], "session": False}),
        ("stream", {"name": "stdout", "text": "héllo\n\x1egpuo fake\n"}),
        ("metrics", {"gpu": [], "note": "no GPU visible, running on CPU"}),
        ("done", {"status": "ok", "elapsed": 0.5}),
    )
    events = FrameDecoder(nonce).feed(b"".join(lines))
    assert events == [
        Hello(0, "3.11.7", 42, ("A100",), False),
        Stream(1, "stdout", "héllo\n\x1egpuo fake\n"),
        Metrics(2, (), "no GPU visible, running on CPU"),
        Done(3, "ok", 0.5),
    ]
    # one line per frame, whatever the text held
    assert all(line.count(b"\n") == 1 and line.endswith(b"\n") for line in lines)


def test_chunks_split_anywhere_decode_the_same(nonce: str) -> None:
    data = b"".join(encode(nonce, *[("stream", {"name": "stdout", "text": f"ünï {i}\n"}) for i in range(50)]))
    decoder = FrameDecoder(nonce)
    events = []
    for start in range(0, len(data), 7):  # cuts frames and multi-byte characters in the middle
        events += decoder.feed(data[start : start + 7])
    events += decoder.close()
    assert [e.text for e in events if isinstance(e, Stream)] == [f"ünï {i}\n" for i in range(50)]


def test_large_payload_is_split_into_parts_under_the_limit_and_reassembled(nonce: str) -> None:
    # quotes and backslashes double when a chunk is embedded again: the worst case for the splitter
    html = ('<div class="x">\\' * 4000) + "é" * 3000
    lines = encode(nonce, ("display_data", {"data": {"text/html": html}, "metadata": {}}))
    assert len(lines) > 3
    assert max(len(line) for line in lines) <= MAX_FRAME_BYTES
    events = FrameDecoder(nonce).feed(b"".join(lines))
    assert len(events) == 1
    assert isinstance(events[0], DisplayData)
    assert events[0].data == {"text/html": html}


def test_resumed_stream_drops_what_was_already_seen(nonce: str) -> None:
    lines = encode(nonce, *[("stream", {"name": "stdout", "text": f"{i}\n"}) for i in range(10)])
    first = FrameDecoder(nonce)
    got = first.feed(b"".join(lines[:6]))
    # the log stream broke; the resumed stream starts earlier than where we stopped (log "since" is coarse)
    resumed = FrameDecoder(nonce, last_seen=first.last_seen)
    got += resumed.feed(b"".join(lines[3:]))
    assert [e.text for e in got if isinstance(e, Stream)] == [f"{i}\n" for i in range(10)]


def test_resume_in_the_middle_of_parts_neither_loses_nor_repeats(nonce: str) -> None:
    text = "x" * (3 * MAX_FRAME_BYTES)
    lines = encode(
        nonce, ("stream", {"name": "stdout", "text": text}), ("done", {"status": "ok", "elapsed": 1})
    )
    decoder = FrameDecoder(nonce)
    assert decoder.feed(b"".join(lines[:2])) == []
    events = decoder.feed(b"".join(lines))  # everything again, from the start
    assert [type(e) for e in events] == [Stream, Done]
    assert isinstance(events[0], Stream) and events[0].text == text


def test_lines_that_are_not_this_runs_frames_are_noise(nonce: str) -> None:
    other = secrets.token_hex(16)
    stray = encode(other, ("done", {"status": "ok", "elapsed": 0}))[0]
    decoder = FrameDecoder(nonce)
    events = decoder.feed(b"image banner\r\n" + stray + b"\x1egpuo " + nonce.encode() + b" 0 done {oops\n")
    assert [type(e) for e in events] == [Noise, Noise, Noise]
    assert isinstance(events[0], Noise) and events[0].line == "image banner"
    assert "nonce" in events[1].reason and "JSON" in events[2].reason


def test_unknown_kinds_pass_through_for_newer_runners(nonce: str) -> None:
    events = FrameDecoder(nonce).feed(b"".join(encode(nonce, ("progress", {"pct": 5}))))
    assert events == [UnknownFrame(0, "progress", {"pct": 5})]


def test_a_frame_missing_fields_is_reported_not_raised(nonce: str) -> None:
    events = FrameDecoder(nonce).feed(b"".join(encode(nonce, ("stream", {"name": "stdout"}))))
    assert len(events) == 1 and isinstance(events[0], Noise)
    assert "stream frame" in events[0].reason


@pytest.mark.parametrize("bad", ["", "ABCDEF" * 6, "0" * 31, "g" * 32])
def test_a_bad_nonce_is_refused_with_the_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="secrets.token_hex"):
        FrameDecoder(bad)
    with pytest.raises(ValueError, match="32 lower-case hex"):
        FrameEncoder(bad, print)
