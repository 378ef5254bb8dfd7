"""A frame whose fields have the wrong types is a FrameError, never an event: every reader (the notebook, the
shell, the panel, ``%gpu_offload status``) uses the fields as the event's types say."""

from __future__ import annotations

import secrets

import pytest

from gpu_offload.runner.frames import FrameDecoder, FrameEncoder, FrameError, Metrics


@pytest.mark.parametrize("kind, payload", [
    ("metrics", {"gpu": [], "note": {"html": "<b>x</b>"}}),
    ("metrics", {"gpu": [{"index": 0, "name": ["A100"], "util": 5}]}),
    ("metrics", {"gpu": [{"index": 0, "name": "A100", "util": "high"}]}),
    ("metrics", {"gpu": {"index": 0}}),
    ("hello", {"python": "3.11.7", "pid": 1, "gpus": [{"name": "A100"}], "session": False}),
    ("hello", {"python": ["3"], "pid": 1}),
    ("stream", {"name": "stdout", "text": ["not", "text"]}),
    ("error", {"ename": "E", "evalue": "v", "traceback": [1, 2]}),
    ("outputs", {"names": [{"x": 1}], "pickle": "", "buffers": []}),
    ("outputs", {"names": ["x"], "pickle": "", "buffers": ["not a reference"]}),
    ("display_data", {"data": ["text/plain"]}),
    ("done", {"status": "ok", "elapsed": "forever"}),
    ("done", {"status": "ok", "elapsed": 1.0, "gpu_peak": 1 << 60}),
    ("done", {"status": "ok", "elapsed": 1.0, "gpu_peak": "80Gi"}),
    ("warning", {"text": None}),
    ("hello", {"python": "3.11.7", "pid": 1, "boot": -1.0}),
    ("hello", {"python": "3.11.7", "pid": 1, "boot": "fast"}),
    ("status", {"state": "running", "imports": 1e300}),
    ("stopping", {"signal": {"name": "SIGTERM"}, "session": True, "checkpoint": True}),
    ("stopping", {"signal": "SIGTERM", "session": "yes", "checkpoint": True}),
    ("stopping", {"signal": "SIGTERM", "session": True, "checkpoint": 1}),
])
def test_a_mistyped_field_is_a_frame_error_naming_it(kind: str, payload: dict) -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    FrameEncoder(nonce, lines.append).emit(kind, **payload)
    (event,) = FrameDecoder(nonce).feed(b"".join(lines))
    assert isinstance(event, FrameError) and f"{kind} frame lacks or mistypes a field" in event.reason


def test_well_typed_metrics_still_decode() -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    FrameEncoder(nonce, lines.append).emit(
        "metrics", gpu=[{"index": 0, "name": "A100", "util": 5, "mem_used": 1, "mem_total": 2, "temp": 40.5}],
        note="no GPU")
    (event,) = FrameDecoder(nonce).feed(b"".join(lines))
    assert isinstance(event, Metrics) and event.note == "no GPU" and event.gpu[0].util == 5.0


def test_the_runners_own_durations_decode_and_older_runners_leave_them_out() -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    encoder.emit("hello", python="3.11.7", pid=1, gpus=[], session=False, boot=0.25)
    encoder.emit("hello", python="3.11.7", pid=1, gpus=[], session=False)
    encoder.emit("status", state="running", imports=1.5)
    encoder.emit("status", state="loading inputs")
    timed, older, running, loading = FrameDecoder(nonce).feed(b"".join(lines))
    assert (timed.boot, older.boot, running.imports, loading.imports) == (0.25, None, 1.5, None)


def test_a_runners_gpu_peak_decodes_and_older_runners_leave_it_out() -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    encoder.emit("done", status="ok", elapsed=1.0, gpu_peak=3 * 2**30)
    encoder.emit("done", status="ok", elapsed=1.0)
    measured, older = FrameDecoder(nonce).feed(b"".join(lines))
    assert (measured.gpu_peak, older.gpu_peak) == (3 * 2**30, None)
