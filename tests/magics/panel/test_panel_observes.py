"""The panel observes: it shows a run's events as the engine publishes them to the kernel's run book, and its
cancel button stops the run through the run's cancel handle (a ``--noblock`` run here, followed in its own
thread; the runner is a script of events, no process is started)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpu_offload.magics.dashboard.clusters import local_row
from gpu_offload.magics.dashboard.widget import Panel, PanelActions

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.engine import FollowSettings
from gpu_offload.engine.execution import Launch, OffloadHandle
from gpu_offload.engine.observing import RunEvents
from gpu_offload.engine.request import OffloadRequest
from gpu_offload.engine.runs.listing import list_runs
from gpu_offload.engine.runs.records import RunBook, RunEntry
from gpu_offload.engine.runs.tracking import Tracker
from gpu_offload.engine.sinks import RecordingSink

from ...engine.scripted import ScriptedBackend, ScriptedRun, started_line, wait_for


def _state(panel: Panel, run_id: str) -> str:
    found = re.search(r'gpu-offload-state"[^>]*>(\w+)<', panel._run_rows[run_id].summary.value)
    return found.group(1) if found else ""


def test_the_panel_shows_a_runs_events_and_its_cancel_button_stops_it_through_the_handle(tmp_path: Path) -> None:
    book = Tracker(RunBook(tmp_path), kernel="k")
    events = RunEvents()
    events.subscribe(book)  # as the magic subscribes the kernel's run book
    run = ScriptedRun(started_line("epoch 1\n"), hold=True)
    cell = "x = 1\nprint('epoch 1')"
    namespace = {"x": 0}
    handle = OffloadHandle(OffloadRequest(cell, noblock=True), Launch(analyse_cell(cell, {})), namespace,
                           ScriptedBackend([run]), FollowSettings(grace=60), RecordingSink(), events)
    said: list[str] = []

    def cancel(record: RunEntry) -> str:
        said.append(record.run_id)
        return "asked" if book.cancel(record.run_id) else "not here"

    panel = Panel(lambda: ([local_row([])], []), lambda: list_runs(book.records(), book.book),
                  PanelActions(lambda row: None, lambda: "local", cancel), wait_change=lambda t: None, interval=0.05,
                  throttle=0.05)
    try:
        wait_for(lambda: handle.run_id in panel._run_rows and "epoch 1" in panel._run_rows[handle.run_id].output.value,
                 "the run's first line in the panel")
        assert _state(panel, handle.run_id) == "running"
        assert not panel._run_rows[handle.run_id].cancel.disabled

        panel.click_cancel(handle.run_id)
        assert said == [handle.run_id] and "asked" in panel.message.value
        assert handle.wait(30) and handle.status == "cancelled"
        assert run.interrupted == 1 and not run.killed
        with pytest.raises(KeyboardInterrupt):
            handle.result()
        assert namespace == {"x": 0}  # nothing copied back
        wait_for(lambda: _state(panel, handle.run_id) == "failed", "the cancelled run shown as failed")
        assert "cancelled" in panel._run_rows[handle.run_id].summary.value
        assert "stopping" in panel._run_rows[handle.run_id].output.value  # its last line, kept
    finally:
        panel.close()
        handle.cancel()
        handle.wait(30)
