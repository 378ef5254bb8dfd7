"""What the notebook panel costs: per event on the engine's path, and per refresh of the panel.

- per event: following a run's events published to the run book (records kept, state files written
  throttled) against the backend's own run, with the frames decoded by the real decoder;
- per refresh: reading the state directory (N run records of other kernels) and listing the runs;
  a full ``Panel.refresh`` with N rows (widget state updated in place, no frontend attached).

Prints a Markdown table with the machine and the date. Run: ``.venv/bin/python bench/bench_panel.py``.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

from gpu_offload.magics.dashboard.clusters import local_row
from gpu_offload.magics.dashboard.widget import Panel, PanelActions
from harness import Run, Stopwatch, timed  # bench/harness.py: the script's folder is on sys.path

from gpu_offload.engine.backends.base import Job, RunEvent, RunRequest
from gpu_offload.engine.observing import CancelHandle, RunEvents, RunStarted
from gpu_offload.engine.runs.listing import list_runs
from gpu_offload.engine.runs.records import RunBook
from gpu_offload.engine.runs.tracking import Tracker
from gpu_offload.runner.frames import FrameDecoder, FrameEncoder

EVENTS = 20_000


class Replay:
    """A run replaying decoded events (the backend's side is not what is measured)."""

    def __init__(self, events: list[RunEvent]) -> None:
        self.events, self.at = events, 0

    def next_event(self, timeout: float) -> RunEvent | None:
        if self.at >= len(self.events):
            return None
        self.at += 1
        return self.events[self.at - 1]

    def interrupt(self) -> None: ...
    def kill(self) -> None: ...
    def release(self, grace: float) -> int | None:
        return 0


def decoded(nonce: str) -> list[RunEvent]:
    out: list[bytes] = []
    enc = FrameEncoder(nonce, out.append)
    for i in range(EVENTS):
        if i % 10 == 0:
            gpu = [{"index": 0, "name": "L4", "util": i % 100, "mem_used": i, "mem_total": 10**9}]
            enc.emit("metrics", gpu=gpu)
        else:
            enc.emit("stream", name="stdout", text=f"line {i}\n")
    return list(FrameDecoder(nonce).feed(b"".join(out)))


def per_event(tmp: Path) -> tuple[float, float]:
    nonce = secrets.token_hex(16)
    events = decoded(nonce)
    raw = Replay(events)
    start = Stopwatch()
    while raw.next_event(0) is not None:
        pass
    bare = start.seconds / len(events)
    runs = Tracker(RunBook(tmp / "events"), kernel="bench")
    published = RunEvents()
    published.subscribe(runs)  # as the magic subscribes the kernel's run book
    job = Job("bench-run", nonce, b"", RunRequest())
    published.submitting(job, "local")
    published.started(RunStarted(job, "local", "local", CancelHandle()))
    replay = Replay(events)
    start = Stopwatch()
    while (event := replay.next_event(0)) is not None:
        published.event(job.run_id, event)  # what the engine's follower does with each event
    return bare, start.seconds / len(events)


def fill(book: RunBook, count: int) -> None:
    other = Tracker(book, kernel="other-kernel")
    for i in range(count):
        other.new(Job(f"run-{i:05d}", "0" * 32, b"", RunRequest()), "local")


def main() -> None:
    run = Run("panel", "Notebook panel")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        bare, tracked = per_event(tmp)
        run.figure("per event, backend's run (replay)", bare * 1e6, "µs")
        run.figure("per event, published to the run book (record + throttled state file)", tracked * 1e6, "µs")
        for count in (10, 50, 200):
            book = RunBook(tmp / f"book-{count}")
            fill(book, count)
            listing, _ = timed(lambda book=book: list_runs([], book), 20)  # type: ignore[misc]
            panel = Panel(lambda: ([local_row([])], []), lambda book=book: list_runs([], book),  # type: ignore[misc]
                          PanelActions(lambda row: None, lambda: "local", lambda rec: ""), interval=3600,
                          max_runs=count)
            refresh, _ = timed(panel.refresh, 20)
            panel.close()
            run.figure(f"list runs, {count} records in the state dir", listing, "ms")
            run.figure(f"Panel.refresh, {count} rows", refresh, "ms")
    run.write()

if __name__ == "__main__":
    main()
