"""The engine publishes every run to the listeners subscribed to a front end's run events, and anything but
the user's own Ctrl-C stops a run through the cancel handle it was started with: a first request interrupts
the cell as Ctrl-C would (output kept, nothing copied back), a second kills the runner at once. Runs here
play a script of runner events (``scripted``); no process is started."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import Job, RunEvent
from gpu_offload.engine.engine import TRUSTED, FollowSettings, follow
from gpu_offload.engine.execution import Launch, run_blocking, start
from gpu_offload.engine.observing import RunEvents, RunStarted
from gpu_offload.engine.request import OffloadRequest
from gpu_offload.engine.runs.records import RunBook
from gpu_offload.engine.runs.tracking import Tracker
from gpu_offload.engine.sinks import RecordingSink
from gpu_offload.runner.frames import Stream

from .scripted import ScriptedBackend, ScriptedRun, started_line, wait_for

CELL = "x = 'after'\nprint('started')"


class Recorder:
    """A listener that writes down what it is told."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def submitting(self, job: Job, backend: str) -> None:
        self.heard.append(("submitting", backend))

    def not_started(self, job: Job, error: BaseException) -> None:
        self.heard.append(("not_started", str(error)))

    def started(self, run: RunStarted) -> None:
        self.heard.append(("started", run.cluster))

    def event(self, run_id: str, event: RunEvent) -> None:
        self.heard.append(("event", event))

    def waiting(self, run_id: str) -> None:
        pass

    def ended(self, run_id: str) -> None:
        self.heard.append(("ended", run_id))


class Broken(Recorder):
    """A listener with a bug in every call."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("submitting", "not_started", "started", "event", "waiting", "ended"):
            raise RuntimeError(f"listener bug in {name}")
        return super().__getattribute__(name)


def _launch() -> Launch:
    return Launch(analyse_cell(CELL, {}))


def test_one_subscription_hears_a_run_from_submission_to_release_and_unsubscribing_ends_it(tmp_path: Path) -> None:
    events, heard, book = RunEvents(), Recorder(), Tracker(RunBook(tmp_path), kernel="k")
    unsubscribe = events.subscribe(heard)
    events.subscribe(book)
    backend = ScriptedBackend([ScriptedRun(started_line("started\n")), ScriptedRun(started_line("again\n"))])
    sink = RecordingSink()
    outcome = run_blocking(OffloadRequest(CELL), _launch(), {}, backend, sink, FollowSettings(), events=events)
    assert outcome.status == "ok"

    kinds = [kind for kind, _ in heard.heard]
    assert kinds[:2] == ["submitting", "started"] and kinds[-1] == "ended"
    assert heard.heard[-1] == ("ended", backend.submitted[0].run_id)
    # the listener heard exactly the events the engine followed, in order
    streams = [e.text for kind, e in heard.heard if kind == "event" and isinstance(e, Stream)]
    assert streams == ["started\n"] == [args[1] for call, args in sink.calls if call == "stream"]
    (record,) = book.records()
    assert (record.run_id, record.state, record.tail) == (backend.submitted[0].run_id, "done", "started\n")

    unsubscribe()
    run_blocking(OffloadRequest(CELL), _launch(), {}, backend, RecordingSink(), FollowSettings(), events=events)
    assert heard.heard[-1] == ("ended", backend.submitted[0].run_id)  # nothing of the second run
    assert len(book.records()) == 2  # the run book is still subscribed


def test_a_run_the_backend_refuses_is_heard_as_not_started_and_recorded_failed(tmp_path: Path) -> None:
    events, heard, book = RunEvents(), Recorder(), Tracker(RunBook(tmp_path), kernel="k")
    events.subscribe(heard)
    events.subscribe(book)
    with pytest.raises(IndexError):  # the scripted backend has no run to give
        start(OffloadRequest(CELL), _launch(), {}, ScriptedBackend([]), events=events)
    assert [kind for kind, _ in heard.heard] == ["submitting", "not_started"]
    (record,) = book.records()
    assert record.state == "failed" and record.finished


def test_a_listener_that_raises_loses_nothing_of_the_run(tmp_path: Path) -> None:
    events, book = RunEvents(), Tracker(RunBook(tmp_path), kernel="k")
    events.subscribe(Broken())
    events.subscribe(book)
    namespace = {"x": "before"}
    sink = RecordingSink()
    outcome = run_blocking(OffloadRequest(CELL), _launch(), namespace, ScriptedBackend([ScriptedRun(
        started_line("started\n"))]), sink, FollowSettings(), events=events)
    assert outcome.status == "ok" and ("stream", ("stdout", "started\n")) in sink.calls
    assert events.errors and all("listener bug" in str(e) for e in events.errors)
    assert book.records()[0].state == "done"  # the other listener heard everything


def test_cancel_through_the_run_book_stops_a_foreground_run_as_ctrl_c_would(tmp_path: Path) -> None:
    events, book = RunEvents(), Tracker(RunBook(tmp_path), kernel="k")
    events.subscribe(book)
    run = ScriptedRun(started_line("started\n"), hold=True)
    backend = ScriptedBackend([run])

    def press_cancel() -> None:  # the panel's thread, once the run shows its first line
        wait_for(lambda: book.records() and "started" in book.records()[0].tail, "the first line recorded")
        assert book.cancel(book.records()[0].run_id)

    presser = threading.Thread(target=press_cancel)
    presser.start()
    namespace = {"x": "before"}
    sink = RecordingSink()
    # followed on the main thread, as a notebook cell is: the handle ends the run, nothing raises inside the
    # follower; the cell then ends as after Ctrl-C
    with pytest.raises(KeyboardInterrupt, match="cancelled"):
        run_blocking(OffloadRequest(CELL), _launch(), namespace, backend, sink, FollowSettings(grace=60), events=events)
    presser.join()
    assert run.interrupted == 1 and not run.killed and run.released
    assert run.reads_after_interrupt > 0  # the follower kept reading: the cell's last line was kept
    assert ("stream", ("stdout", "stopping\n")) in sink.calls
    assert namespace == {"x": "before"}
    (record,) = book.records()
    assert (record.state, record.detail) == ("failed", "cancelled")
    assert not book.cancel(record.run_id)  # over: nothing left to cancel


def test_a_second_cancel_kills_a_runner_that_ignores_the_interrupt_without_waiting_the_grace(tmp_path: Path) -> None:
    events, book = RunEvents(), Tracker(RunBook(tmp_path), kernel="k")
    events.subscribe(book)
    run = ScriptedRun(started_line("started\n"), hold=True, deaf=True)
    started = start(OffloadRequest(CELL), _launch(), {}, ScriptedBackend([run]), events=events)
    grace = 600.0

    def press_twice() -> None:
        wait_for(lambda: "started" in book.records()[0].tail, "the first line recorded")
        started.cancel.cancel()
        wait_for(lambda: run.interrupted, "the interrupt sent")
        started.cancel.cancel()

    presser = threading.Thread(target=press_twice)
    presser.start()
    began = time.monotonic()
    outcome = follow(started.run, RecordingSink(), FollowSettings(grace=grace), TRUSTED, watch=started.watch)
    presser.join()
    started.release(1.0)
    assert outcome.status == "cancelled" and run.killed
    assert time.monotonic() - began < grace / 2  # killed on the second request, not after the grace period


def test_a_cancel_asked_through_the_state_directory_reaches_the_run_through_its_handle(tmp_path: Path) -> None:
    events, book = RunEvents(), Tracker(RunBook(tmp_path), kernel="k")
    events.subscribe(book)
    run = ScriptedRun(started_line("started\n"), hold=True)
    started = start(OffloadRequest(CELL), _launch(), {}, ScriptedBackend([run]), events=events)
    elsewhere = RunBook(tmp_path)  # another kernel, the runs REST API or `gpu-offload cancel`
    done = threading.Event()

    def ask() -> None:
        wait_for(lambda: "started" in book.records()[0].tail, "the first line recorded")
        elsewhere.request_cancel(started.watch.run_id)
        done.set()

    asker = threading.Thread(target=ask)
    asker.start()
    outcome = follow(started.run, RecordingSink(), FollowSettings(grace=60), TRUSTED, watch=started.watch)
    asker.join()
    started.release(1.0)
    assert done.is_set() and outcome.status == "cancelled" and run.interrupted == 1
    assert started.cancel.presses == 1
    assert not elsewhere.cancel_requested(started.watch.run_id)  # the request was taken
    assert (book.records()[0].state, book.records()[0].detail) == ("failed", "cancelled")
