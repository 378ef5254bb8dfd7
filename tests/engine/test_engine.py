"""`%gpu_offload status` describes the last run, including GPU metrics (no GPU here: built from frames)."""

from __future__ import annotations

import secrets

from gpu_offload.engine.engine import Outcome, describe
from gpu_offload.runner.frames import FrameDecoder, FrameEncoder, Hello, Metrics


def test_status_lines_name_the_runner_and_each_gpu_even_with_missing_fields() -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    encoder.emit("hello", python="3.11.7", pid=42, gpus=["NVIDIA A100-SXM4-40GB"], session=False)
    gpu = {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "util": 87.0, "mem_used": 10 * 2**30}
    encoder.emit("metrics", gpu=[{**gpu, "mem_total": 40 * 2**30, "temp": 65.0, "power": None}])
    decoder = FrameDecoder(nonce)
    events = [event for line in lines for event in decoder.feed(line)]
    hello = next(e for e in events if isinstance(e, Hello))
    metrics = next(e for e in events if isinstance(e, Metrics))
    text = describe(Outcome(status="ok", elapsed=1.5, hello=hello, metrics=metrics))
    assert "last run: ok in 1.50 s" in text
    assert "runner: Python 3.11.7, pid 42, GPUs: NVIDIA A100-SXM4-40GB" in text
    assert "GPU 0 NVIDIA A100-SXM4-40GB: 87% busy, 10.0/40.0 GiB, 65 C, ? W" in text


class ReplayedRun:
    """A run whose events are a runner's decoded stdout, replayed (the engine's side of the protocol)."""

    def __init__(self, events: list) -> None:  # type: ignore[type-arg]
        self.events = list(events)

    def next_event(self, timeout: float):  # type: ignore[no-untyped-def]
        return self.events.pop(0) if self.events else None

    def interrupt(self) -> None:
        raise AssertionError("nothing should interrupt this run")

    kill = interrupt

    def release(self, grace: float) -> None:
        return None


def test_a_frame_that_does_not_decode_is_named_and_the_run_goes_on() -> None:
    from gpu_offload.engine.engine import TRUSTED, FollowSettings, follow
    from gpu_offload.engine.sinks import RecordingSink

    nonce = secrets.token_hex(16)
    nested = "[" * 975 + "]" * 975
    stdout = (
        f'\x1egpuo {nonce} 0 - 0 display_data {{"data":{{"application/json":{nested}}},"metadata":{{}}}}\n'
        f'\x1egpuo {nonce} 1 - 0 stream {{"name":"stdout","text":"after\\n"}}\n'
        f'\x1egpuo {nonce} 2 - 0 done {{"status":"ok","elapsed":0.1}}\n'
    )
    sink = RecordingSink()
    outcome = follow(ReplayedRun(FrameDecoder(nonce).feed(stdout)), sink, FollowSettings(), TRUSTED)
    assert outcome.status == "ok"
    notices = [args[0] for kind, args in sink.calls if kind == "notice"]
    assert len(notices) == 1 and "dropped" in notices[0] and "nested deeper than 100" in notices[0]
    assert ("stream", ("stdout", "after\n")) in sink.calls


def test_a_runner_stopped_by_sigterm_says_so_in_the_running_cell_in_the_kernels_words() -> None:
    from gpu_offload.engine.engine import TRUSTED, FollowSettings, follow
    from gpu_offload.engine.sinks import RecordingSink

    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    encoder = FrameEncoder(nonce, lines.append)
    encoder.emit("stream", name="stdout", text="epoch 1\n")
    # a donor's runner may put anything in the signal's name: it is shown on one line, at most 20 characters
    encoder.emit("stopping", signal="SIGTERM\x1b[2J\nfake: restored everything" + "!" * 500, session=True,
                 checkpoint=True)
    encoder.emit("done", status="interrupted", elapsed=0.2)
    sink = RecordingSink()
    follow(ReplayedRun(FrameDecoder(nonce).feed(b"".join(lines))), sink, FollowSettings(), TRUSTED)
    notices = [args[0] for kind, args in sink.calls if kind == "notice"]
    [stopping] = [n for n in notices if "is being stopped" in n]
    assert stopping == ("warning: this session's pod is being stopped (SIGTERM [2J fake: re...: Kubernetes is "
                        "deleting it, as a preemption, a drain or an eviction does); checkpointing now: the cell is "
                        "interrupted and its session's state written")
    assert [kind for kind, _ in sink.calls].index("stream") < [kind for kind, _ in sink.calls].index("notice")


def test_the_sigterm_notice_says_whether_the_state_is_kept() -> None:
    from gpu_offload.engine.engine import stopping_notice
    from gpu_offload.runner.frames import Stopping

    assert stopping_notice(Stopping(0, "SIGTERM", True, False)).endswith(
        "the cell is interrupted, and no checkpoint is armed, so the session's state goes")
    assert stopping_notice(Stopping(0, "SIGTERM", False, False)) == (
        "warning: this cell's pod is being stopped (SIGTERM: Kubernetes is deleting it, as a preemption, a drain or "
        "an eviction does); the cell is interrupted")
