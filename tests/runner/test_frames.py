"""The wire format on its own: what the engine decodes is exactly what the runner encoded."""

from __future__ import annotations

import secrets

import pytest

from gpu_offload.runner.frames import (
    MAX_FRAME_BYTES,
    DisplayData,
    Done,
    FrameDecoder,
    FrameEncoder,
    FrameError,
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


def test_held_frames_leave_in_one_write_in_their_order(nonce: str) -> None:
    writes: list[bytes] = []
    encoder = FrameEncoder(nonce, writes.append)
    encoder.emit("stream", name="stdout", text="a\n")
    encoder.hold()
    encoder.emit("display_data", data={"text/plain": "x" * MAX_FRAME_BYTES}, metadata={})  # in parts
    encoder.emit("stream", name="stderr", text="b\n")
    encoder.emit("done", status="ok", elapsed=0.1)
    assert len(writes) == 1  # nothing of what is held has left yet
    encoder.release()
    encoder.release()  # nothing held: nothing written
    assert len(writes) == 2
    events = FrameDecoder(nonce).feed(b"".join(writes))
    assert [type(e) for e in events] == [Stream, DisplayData, Stream, Done]
    assert [e.seq for e in events] == [0, 3, 4, 5]  # the display's two part frames are seq 1-2
    encoder.emit("stream", name="stdout", text="c\n")
    assert len(writes) == 3  # written at once again


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
    events = decoder.feed(b"image banner\r\n" + stray + b"\x1egpuo " + nonce.encode() + b" 0 - 0 done {oops\n")
    assert [type(e) for e in events] == [Noise, Noise, FrameError]
    assert isinstance(events[0], Noise) and events[0].line == "image banner"
    assert isinstance(events[1], Noise) and "nonce" in events[1].reason
    # a frame of this run that does not decode is the run's problem, not diagnostics noise
    assert isinstance(events[2], FrameError) and "JSON" in events[2].reason


def test_unknown_kinds_pass_through_for_newer_runners(nonce: str) -> None:
    events = FrameDecoder(nonce).feed(b"".join(encode(nonce, ("progress", {"pct": 5}))))
    assert events == [UnknownFrame(0, "progress", {"pct": 5})]


def test_a_frame_missing_fields_is_reported_not_raised(nonce: str) -> None:
    events = FrameDecoder(nonce).feed(b"".join(encode(nonce, ("stream", {"name": "stdout"}))))
    assert len(events) == 1 and isinstance(events[0], FrameError)
    assert "stream frame" in events[0].reason


@pytest.mark.parametrize("bad", ["", "ABCDEF" * 6, "0" * 31, "g" * 32])
def test_a_bad_nonce_is_refused_with_the_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="secrets.token_hex"):
        FrameDecoder(bad)
    with pytest.raises(ValueError, match="32 lower-case hex"):
        FrameEncoder(bad, print)


def run_lines(nonce: str, run_id: str, *events: tuple[str, dict], encoder: FrameEncoder | None = None):
    lines: list[bytes] = []
    encoder = encoder or FrameEncoder(nonce, lines.append)
    encoder.begin_run(run_id)
    for kind, payload in events:
        encoder.emit(kind, **payload)
    encoder.end_run()
    return lines


def test_frames_of_another_run_are_dropped_and_counted(nonce: str) -> None:
    # a session's runner: hello outside any run, then a run whose frames the reader did not finish reading
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    encoder.emit("hello", python="3.11.7", pid=1, gpus=[], session=True)
    run_lines(nonce, "run-1", ("stream", {"name": "stdout", "text": "old\n"}),
              ("done", {"status": "ok", "elapsed": 0}), encoder=encoder)
    run_lines(nonce, "run-2", ("stream", {"name": "stdout", "text": "new\n"}),
              ("done", {"status": "error", "elapsed": 1}), encoder=encoder)
    decoder = FrameDecoder(nonce)
    decoder.expect_run("run-2")
    events = decoder.feed(b"".join(lines))
    assert events == [Hello(0, "3.11.7", 1, (), True), Stream(3, "stdout", "new\n"), Done(4, "error", 1.0)]
    assert decoder.foreign == 2
    # without a run to expect, every run's frames pass (a reader that does not know the run id)
    assert len(FrameDecoder(nonce).feed(b"".join(lines))) == 5


def test_a_run_id_that_is_not_a_plain_name_still_identifies_its_run(nonce: str) -> None:
    lines = run_lines(nonce, "run with spaces/and slashes", ("done", {"status": "ok", "elapsed": 0}))
    assert FrameDecoder(nonce, run_id="run with spaces/and slashes").feed(b"".join(lines)) == [Done(0, "ok", 0)]
    other = FrameDecoder(nonce, run_id="run with spaces")
    assert other.feed(b"".join(lines)) == [] and other.foreign == 1


def test_deeply_nested_json_is_a_frame_error_and_the_stream_goes_on(nonce: str) -> None:
    # what the runner sends for a display of JSON nested 975 levels (written out: under pytest's stack
    # json.dumps itself would run out of recursion)
    nested = "[" * 975 + "]" * 975
    display = f'\x1egpuo {nonce} 0 - 0 display_data {{"data":{{"application/json":{nested}}},"metadata":{{}}}}\n'
    done = f'\x1egpuo {nonce} 1 - 0 done {{"status":"ok","elapsed":0}}\n'
    events = FrameDecoder(nonce).feed((display + done).encode())
    assert [type(e) for e in events] == [FrameError, Done]
    assert "nested deeper" in events[0].reason


def test_an_endless_line_is_cut_and_the_frames_after_it_decode(nonce: str) -> None:
    decoder = FrameDecoder(nonce)
    events = []
    chunk = b"z" * (1 << 16)
    for _ in range(256):  # 16 MiB without a newline
        events += decoder.feed(chunk)
    assert events == []
    assert decoder._lines._size == 256 * len(chunk) and decoder._lines._pending == []  # nothing kept
    events += decoder.feed(b"\n" + b"".join(encode(nonce, ("done", {"status": "ok", "elapsed": 0}))))
    assert [type(e) for e in events] == [Noise, Done]
    assert events[0].line == "z" * 200 and str(256 * len(chunk)) in events[0].reason


def test_an_event_larger_than_the_bound_is_dropped_with_a_frame_error(nonce: str) -> None:
    lines = encode(
        nonce,
        ("stream", {"name": "stdout", "text": "x" * (4 * MAX_FRAME_BYTES)}),
        ("stream", {"name": "stdout", "text": "small"}),
    )
    decoder = FrameDecoder(nonce, max_event_bytes=2 * MAX_FRAME_BYTES)
    events = decoder.feed(b"".join(lines))
    assert [type(e) for e in events] == [FrameError, Stream]
    assert "exceeds" in events[0].reason and decoder._part_bytes == 0


def test_an_event_left_unfinished_is_reported_when_the_next_one_starts(nonce: str) -> None:
    big = encode(nonce, ("stream", {"name": "stdout", "text": "x" * (3 * MAX_FRAME_BYTES)}),
                 ("stream", {"name": "stdout", "text": "y" * (3 * MAX_FRAME_BYTES)}))
    first_parts = [line for line in big if b'"id":0' in line]
    second_parts = [line for line in big if b'"id":1' in line]
    events = FrameDecoder(nonce).feed(b"".join(first_parts[:-1] + second_parts))
    assert [type(e) for e in events] == [FrameError, Stream]
    assert "unfinished" in events[0].reason and events[1].text == "y" * (3 * MAX_FRAME_BYTES)


def test_the_decoder_never_raises_on_mangled_frames(nonce: str) -> None:
    import random

    rng = random.Random(13)
    good = b"".join(encode(
        nonce,
        ("hello", {"python": "3.11.7", "pid": 42, "gpus": ["A100"], "session": False}),
        ("metrics", {"gpu": [{"index": 0, "name": "A", "util": 1, "mem_used": 2, "mem_total": 3,
                              "temp": 4, "power": 5}]}),
        ("outputs", {"names": ["x"], "pickle": "AAAA", "buffers": []}),
        ("stream", {"name": "stdout", "text": "t" * (2 * MAX_FRAME_BYTES)}),
        ("done", {"status": "ok", "elapsed": 0}),
    ))
    alphabet = b'{}[]":,0123456789-\n\x1e abcdefghijklmnopqrstuvwxyz\xff\xc3'
    for _ in range(400):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 20)):
            data[rng.randrange(len(data))] = rng.choice(alphabet)
        decoder = FrameDecoder(nonce)
        events = decoder.feed(bytes(data)) + decoder.close()
        assert all(type(e).__module__ == FrameDecoder.__module__ for e in events)


def test_a_seq_too_long_to_be_a_number_is_not_a_frame(nonce: str) -> None:
    line = f"\x1egpuo {nonce} {'9' * 5000} - 0 done {{}}\n".encode()
    assert [type(e) for e in FrameDecoder(nonce).feed(line)] == [Noise]
