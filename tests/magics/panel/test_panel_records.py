"""Run records at the engine's event boundary: synthetic runner frames (encoded and decoded by the real frame
code) reach the engine unchanged and the panel's plot, output and state; the state directory shares records
between kernels and names what it cannot read."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from gpu_offload.magics.dashboard.clusters import local_row
from gpu_offload.magics.dashboard.widget import Panel, PanelActions

from gpu_offload.engine.backends.base import Job, RunEvent, RunRequest
from gpu_offload.engine.engine import TRUSTED, FollowSettings, follow
from gpu_offload.engine.observing import CancelHandle, RunEvents, RunStarted, Watch
from gpu_offload.engine.runs.listing import list_runs
from gpu_offload.engine.runs.records import KEEP_FINISHED, PRUNE_SLACK, RunBook, RunEntry
from gpu_offload.engine.runs.tracking import WRITE_EVERY, Tracker
from gpu_offload.engine.sinks import RecordingSink
from gpu_offload.runner.frames import FrameDecoder, FrameEncoder, Metrics

GIB = 2**30


class DecodedRun:
    """A run whose events are runner frames decoded by the engine's own decoder (no process needed)."""

    def __init__(self, lines: bytes, nonce: str) -> None:
        self.events: list[RunEvent] = list(FrameDecoder(nonce).feed(lines))
        self.interrupted = False

    def next_event(self, timeout: float) -> RunEvent | None:
        return self.events.pop(0) if self.events else None

    def interrupt(self) -> None:
        self.interrupted = True

    def kill(self) -> None:
        pass

    def release(self, grace: float) -> int | None:
        return 0


def _frames(nonce: str) -> bytes:
    out: list[bytes] = []
    enc = FrameEncoder(nonce, out.append)
    enc.emit("status", state="pod pending on donor-2: Scheduled")
    enc.emit("hello", python="3.11.7", pid=7, gpus=["L4", "L4"])
    for util, used in ((20.0, 2), (50.0, 6), (80.0, 10)):
        gpus = [{"index": i, "name": "L4", "util": util, "mem_used": used * GIB, "mem_total": 24 * GIB,
                 "temp": 60, "power": 70} for i in range(2)]
        enc.emit("metrics", gpu=gpus)
    enc.emit("stream", name="stdout", text="epoch 1\nepoch 2\nloss 0.1")
    enc.emit("done", status="ok", elapsed=1.0)
    return b"".join(out)


def test_metrics_frames_reach_the_engine_and_the_panel_plot(tmp_path: Path) -> None:
    nonce = secrets.token_hex(16)
    runs = Tracker(RunBook(tmp_path), kernel="kernel-a")
    events = RunEvents()
    events.subscribe(runs)
    job = Job("run-metrics", nonce, b"", RunRequest(gpus=2, cluster="donor-2"))
    events.submitting(job, "kubernetes")
    watch = Watch(job.run_id, CancelHandle(), events)
    events.started(RunStarted(job, "kubernetes", "donor-2", watch.cancel))
    sink = RecordingSink()
    outcome = follow(DecodedRun(_frames(nonce), nonce), sink, FollowSettings(), TRUSTED, watch=watch)
    assert outcome.status == "ok"
    assert [c for c, _ in sink.calls].count("metrics") == 3  # the engine got every event unchanged
    metrics = [args[0] for call, args in sink.calls if call == "metrics"]
    assert isinstance(metrics[-1], Metrics) and metrics[-1].gpu[0].util == 80.0

    (shown,) = runs.records()
    assert (shown.state, shown.cluster, shown.gpus) == ("done", "donor-2", 2)
    assert shown.util == (20.0, 50.0, 80.0)
    assert shown.mem == pytest.approx((2 / 24, 6 / 24, 10 / 24))

    panel = Panel(lambda: ([local_row([])], []), lambda: list_runs(runs.records(), runs.book),
                  PanelActions(lambda row: None, lambda: "local", lambda rec: ""), interval=60)
    try:
        row = panel._run_rows["run-metrics"]
        assert "<svg" in row.plot.value and "GPU 80% busy, memory 42% used" in row.plot.value
        assert row.plot.value.count("<polyline") == 2
        assert "loss 0.1" in row.output.value and "epoch 2" in row.output.value
        assert ">done<" in row.summary.value and "donor-2" in row.summary.value
        assert row.cancel.disabled
    finally:
        panel.close()
    assert not panel.thread.is_alive()


@pytest.mark.e2e  # starts a process
def test_another_kernel_sees_the_record_and_a_dead_kernels_run_is_failed(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    mine = Tracker(book, kernel="kernel-a")
    mine.new(Job("run-live", "0" * 32, b"", RunRequest(gpus=0)), "local")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    theirs = Tracker(book, kernel="kernel-b")
    theirs.pid = int(gone.stdout)  # a kernel that has exited
    theirs.new(Job("run-orphan", "0" * 32, b"", RunRequest(gpus=0)), "local")
    mine.flush()  # what the writer's thread does within WRITE_EVERY
    theirs.flush()

    listed = {r.run_id: r for r in list_runs([], RunBook(tmp_path)).runs}
    assert listed["run-live"].state == "queued" and listed["run-live"].kernel == "kernel-a"
    assert listed["run-orphan"].state == "failed"
    assert f"pid {theirs.pid}" in listed["run-orphan"].detail


def test_an_unreadable_record_is_named_and_the_others_still_listed(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    ok = Tracker(book, kernel="k")
    ok.new(Job("run-ok", "0" * 32, b"", RunRequest(gpus=0)), "local")
    ok.flush()
    (tmp_path / "run-bad.json").write_text("{not json")
    (tmp_path / "run-odd.json").write_text(json.dumps({"run_id": "run-odd", "state": "sleeping"}))
    listing = list_runs([], book)
    assert [r.run_id for r in listing.runs] == ["run-ok"]
    assert any("run-bad.json" in p for p in listing.problems)
    assert any("run-odd.json" in p and "RunEntry" in p for p in listing.problems)


def test_a_run_id_that_is_not_a_plain_name_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    book = RunBook(tmp_path / "runs")
    with pytest.raises(ValueError, match=r"run id '../escape' is not a plain name"):
        book.request_cancel("../escape")
    assert not (tmp_path / "escape.cancel").exists()
    assert not (tmp_path / "runs").exists()


def test_close_wakes_the_thread_even_during_a_long_interval(tmp_path: Path) -> None:
    runs = Tracker(RunBook(tmp_path), kernel="k")
    seen = [runs.version]

    def wait_change(timeout: float) -> None:
        seen[0] = runs.wait_change(seen[0], timeout)

    panel = Panel(lambda: ([local_row([])], []), lambda: list_runs(runs.records(), runs.book),
                  PanelActions(lambda row: None, lambda: "local", lambda rec: ""),
                  wait_change=wait_change, interval=3600, wake=runs.wake)
    assert panel.thread.is_alive()
    panel.close(timeout=60)  # without the wake the thread would sleep out its hour
    assert not panel.thread.is_alive()


def test_a_warm_cells_record_is_written_by_the_next_batch_not_on_the_cells_path(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    runs = Tracker(book, kernel="k", write_every=3600)  # a batch that never comes due by itself here
    short = runs.new(Job("run-short", "0" * 32, b"", RunRequest(gpus=0)), "local")
    runs.put(replace(short, state="running"))
    runs.put(replace(short, state="done", ended=time.time()))
    assert not list(tmp_path.iterdir())  # the cell's end cost no file write
    assert [r.state for r in runs.records()] == ["done"]  # this kernel's panel sees it at once
    runs.flush()
    assert [r.state for r in book.read_all()[0]] == ["done"]  # one write, of the newest version


def test_a_long_runs_record_is_written_by_its_follower_once_the_interval_passed(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    runs = Tracker(book, kernel="k")
    long = runs.new(Job("run-long", "0" * 32, b"", RunRequest(gpus=0)), "local")
    runs.put(replace(long, state="running", tail="epoch 1\n"))
    runs.waiting("run-long")  # the follower's poll
    assert not (tmp_path / "run-long.json").exists()  # not before the interval: a warm cell is over by then
    time.sleep(WRITE_EVERY)
    runs.waiting("run-long")
    assert {r.run_id: (r.state, r.tail) for r in book.read_all()[0]}["run-long"] == ("running", "epoch 1\n")


def test_the_writers_thread_writes_a_runs_end_within_the_interval(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    runs = Tracker(book, kernel="k")
    record = runs.new(Job("run-end", "0" * 32, b"", RunRequest(gpus=0)), "local")
    runs.put(replace(record, state="done", ended=time.time()))
    deadline = time.monotonic() + 60
    while not (tmp_path / "run-end.json").exists() and time.monotonic() < deadline:
        time.sleep(WRITE_EVERY / 10)
    assert [r.state for r in book.read_all()[0]] == ["done"]


@pytest.mark.e2e  # starts a process
def test_records_not_yet_written_are_written_when_the_process_exits(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from gpu_offload.engine.backends.base import Job, RunRequest\n"
        "from gpu_offload.engine.runs.records import RunBook\n"
        "from gpu_offload.engine.runs.tracking import Tracker\n"
        "runs = Tracker(RunBook(__import__('pathlib').Path(sys.argv[1])), kernel='k', write_every=3600)\n"
        "record = runs.new(Job('run-last', '0' * 32, b'', RunRequest(gpus=0)), 'local')\n"
        "runs.put(record.__class__(**{**record.__dict__, 'state': 'done', 'ended': time.time()}))\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    assert [r.state for r in RunBook(tmp_path).read_all()[0]] == ["done"]


def test_prune_keeps_the_newest_finished_records_once_the_slack_is_used(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    for index in range(KEEP_FINISHED + PRUNE_SLACK):
        book.write(RunEntry(f"run-{index:03d}", "k", 1, "local", "local", 0, state="done",
                             started=float(index), ended=float(index)))
    book.prune()
    assert len(book.read_all()[0]) == KEEP_FINISHED + PRUNE_SLACK  # within the slack: nothing parsed
    book.write(RunEntry("run-new", "k", 1, "local", "local", 0, state="done", started=1e9, ended=1e9))
    book.prune()
    kept = [r.run_id for r in book.read_all()[0]]
    assert len(kept) == KEEP_FINISHED and kept[0] == "run-new" and "run-000" not in kept


def test_prune_keeps_other_kernels_running_records_and_does_not_count_them_towards_the_slack(tmp_path: Path) -> None:
    import os

    book = RunBook(tmp_path)
    written = iter(range(1, 10**6))

    def add(run_id: str, **state: object) -> None:
        book.write(RunEntry(run_id, "k", os.getpid(), "local", "local", 0, **state))  # type: ignore[arg-type]
        at = next(written) * 10**9  # oldest first, one second apart (prune ages files by their last write)
        os.utime(tmp_path / f"{run_id}.json", ns=(at, at))

    for index in range(10):  # runs of a live kernel (this process), older than every finished one
        add(f"live-{index}", state="running")
    for index in range(KEEP_FINISHED + PRUNE_SLACK):
        add(f"old-{index:03d}", state="done", ended=1.0)
    book.prune()
    names = {r.run_id for r in book.read_all()[0]}
    assert len(names) == 10 + KEEP_FINISHED and {f"live-{i}" for i in range(10)} <= names
    for index in range(PRUNE_SLACK):  # the finished records reach KEEP + SLACK again: still within the slack
        add(f"new-{index:03d}", state="done", ended=2.0)
    book.prune()
    assert len(book.read_all()[0]) == 10 + KEEP_FINISHED + PRUNE_SLACK
    add("newest", state="done", ended=3.0)
    book.prune()
    names = {r.run_id for r in book.read_all()[0]}
    assert len(names) == 10 + KEEP_FINISHED and "newest" in names and {f"live-{i}" for i in range(10)} <= names


def test_a_runs_record_stays_in_the_state_dir_named_when_it_began(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("GPU_OFFLOAD_STATE_DIR", str(first))
    tracker = Tracker(RunBook(), kernel="k")
    job = Job("run-a", secrets.token_hex(16), b"", RunRequest())
    record = tracker.new(job, "local")
    monkeypatch.setenv("GPU_OFFLOAD_STATE_DIR", str(second))  # %env in the notebook while the run goes on
    tracker.put(replace(record, state="done", ended=time.time()))
    tracker.ended("run-a")
    tracker.flush()
    assert (first / "run-a.json").exists() and not (second / "run-a.json").exists()
    tracker.new(Job("run-b", secrets.token_hex(16), b"", RunRequest()), "local")
    tracker.ended("run-b")  # the next run follows the setting
    tracker.flush()
    assert (second / "run-b.json").exists()


def test_prune_removes_a_background_scripts_log_with_its_record(tmp_path: Path) -> None:
    book = RunBook(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-mine.log"
    outside.write_text("a user's file named as a log: never the state directory's to delete")
    for index in range(KEEP_FINISHED + PRUNE_SLACK + 1):
        log = tmp_path / f"cli-{index:03d}.log"
        log.write_text("output")
        book.write(RunEntry(f"run-{index:03d}", "k", 1, "local", "local", 0, state="done", started=float(index),
                            ended=float(index), script="train.py",
                            log=str(outside if index == 0 else log)))
    book.prune()
    assert not (tmp_path / "cli-001.log").exists() and (tmp_path / f"cli-{KEEP_FINISHED + PRUNE_SLACK:03d}.log").exists()
    assert outside.exists()


def test_cancel_is_offered_only_where_it_can_act_and_no_metrics_yet_only_while_live(tmp_path: Path) -> None:
    import dataclasses
    import os

    from gpu_offload.magics.dashboard.plot import sparkline

    from gpu_offload.engine.runs.listing import cancellable

    runs = Tracker(RunBook(tmp_path), kernel="kernel-a")
    live = runs.new(Job("run-live", "0" * 32, b"", RunRequest(gpus=1)), "local")
    assert live.pid == os.getpid() and not live.finished
    ended = dataclasses.replace(live, state="done", ended=live.started + 1)
    assert cancellable(live) and not cancellable(ended)
    # a run whose kernel is gone: only a cluster run that never ended may still hold a GPU (its pod is deleted)
    orphan = dataclasses.replace(live, pid=2**22 + 12345, backend="kubernetes", state="failed", ended=None)
    assert cancellable(orphan)
    assert not cancellable(dataclasses.replace(orphan, backend="local"))
    assert not cancellable(dataclasses.replace(orphan, ended=orphan.started + 5))

    assert "no GPU metrics yet" in sparkline((), ())
    assert sparkline((), (), live=False) == ""
    assert "no GPU visible" in sparkline((), (), "no GPU visible", live=False)

    panel = Panel(lambda: ([local_row([])], []), lambda: list_runs([live, dataclasses.replace(
        ended, run_id="run-ended")], runs.book), PanelActions(lambda row: None, lambda: "local", lambda rec: ""),
        interval=60)
    try:
        shown, over = panel._run_rows["run-live"], panel._run_rows["run-ended"]
        assert not shown.cancel.disabled and shown.cancel.layout.display == ""
        assert "no GPU metrics yet" in shown.plot.value
        assert over.cancel.disabled and over.cancel.layout.display == "none"
        assert "no GPU metrics yet" not in over.plot.value
    finally:
        panel.close()


def test_the_panels_neutral_colours_follow_jupyterlabs_theme() -> None:
    """Backgrounds, borders and grey text come from JupyterLab's theme variables (with the light theme's
    values as fallbacks), so the dark theme does not show a white plot or black text on black."""
    from gpu_offload.magics.dashboard.plot import sparkline

    plot = sparkline((10.0, 50.0), (0.1, 0.2))
    assert "background:var(--jp-layout-color2" in plot and "border:1px solid var(--jp-border-color2" in plot
    assert "color:var(--jp-ui-font-color2" in sparkline((), ())
    assert "#f7f7f7;" not in plot.replace("#f7f7f7)", "")  # only ever a fallback


def test_prune_never_deletes_a_live_kernels_running_record_however_old(tmp_path: Path) -> None:
    import os

    book = RunBook(tmp_path)
    book.write(RunEntry("run-live", "k", os.getpid(), "local", "local", 0, state="running", started=0.0))
    for index in range(KEEP_FINISHED + PRUNE_SLACK + 1):
        book.write(RunEntry(f"run-{index:03d}", "k", 1, "local", "local", 0, state="done",
                            started=float(index + 1), ended=float(index + 1)))
    book.prune()
    kept = {r.run_id for r in book.read_all()[0]}
    assert "run-live" in kept and "run-000" not in kept
    assert len(kept) == KEEP_FINISHED + 1  # the newest finished ones, and the running one
