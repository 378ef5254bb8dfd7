"""Where the wait from Shift-Enter goes: every run's phases, shown by ``%gpu_offload status --timing`` and kept
on the run's record (local backend, real runner). Never a timing threshold: presence, order, consistency."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_offload.engine.runs.records import RunBook
from gpu_offload.engine.runs.tracking import tracker
from gpu_offload.engine.timing import PHASES, RunTiming

pytestmark = pytest.mark.e2e  # starts runner processes

ONE_SHOT = ("analysis", "bundle", "submitted", "runner start", "imports", "first line", "done")
TICK = 0.011
"""/proc counts a process's start in clock ticks (1/100 s): the runner's own age is that coarse."""


def offload(shell: Any, cell: str, line: str = "") -> Any:
    return shell.run_cell_magic("gpu_offload", line, cell)


def last_timing(shell: Any) -> RunTiming:
    outcome = shell.gpu_offload_magics.last_outcome
    assert outcome is not None and outcome.timing is not None
    return outcome.timing


def assert_ordered(timing: RunTiming) -> None:
    names = [name for name, _ in timing.marks]
    assert names == [p for p in PHASES if p in names]
    offsets = [at for _, at in timing.marks]
    assert offsets == sorted(offsets), timing.marks
    assert all(took >= 0 for _, took in timing.steps())


def test_a_one_shot_cell_times_every_phase_from_shift_enter_to_its_first_line(shell: Any) -> None:
    shell.run_cell("import json")  # a notebook module the cell uses: the runner imports it again
    with capture_output():
        offload(shell, "print(json.dumps([1]))")
    timing = last_timing(shell)
    assert [name for name, _ in timing.marks] == list(ONE_SHOT)  # the local backend has no pod phases
    assert_ordered(timing)
    # what the runner measured fits inside what the engine saw: its process started after the bundle was made,
    # and it imported json between its hello and the `running` status
    assert timing.runner_boot is not None and timing.runner_imports is not None
    assert timing.runner_boot <= timing.at("runner start") - timing.at("bundle") + TICK
    assert 0.0 < timing.runner_imports <= timing.at("imports") - timing.at("runner start")


def test_a_warm_session_cell_has_no_runner_start_and_still_times_its_first_line(shell: Any) -> None:
    with capture_output():
        offload(shell, "a = 1", "--session timing")
        offload(shell, "print(a)", "--session timing")
    timing = last_timing(shell)
    names = [name for name, _ in timing.marks]
    assert "runner start" not in names  # the runner started with the first cell
    assert {"analysis", "bundle", "submitted", "imports", "first line", "done"} <= set(names)
    assert timing.runner_imports == 0.0  # the cell imports nothing
    assert_ordered(timing)
    shell.run_line_magic("gpu_offload", "close timing")


def test_status_timing_shows_the_phases_in_order_and_the_record_keeps_them(shell: Any) -> None:
    with capture_output() as before:
        shell.run_line_magic("gpu_offload", "status --timing")
    assert "no run timed yet" in before.stdout
    with capture_output() as captured:
        offload(shell, "print('first')")
        shell.run_line_magic("gpu_offload", "status --timing")
    shown = captured.stdout
    positions = [shown.index(f"  {name} ") for name in ONE_SHOT if name != "imports"]
    assert positions == sorted(positions)
    assert "runner process start to hello" in shown
    timing = last_timing(shell)
    run_id = [r for r in tracker().records() if r.timing == timing]
    assert len(run_id) == 1, "the run's record keeps the same timing the engine showed"
    tracker().flush()  # what the run book's writer does within its interval
    stored = {r.run_id: r for r in RunBook().read_all()[0]}[run_id[0].run_id]
    assert stored.timing == timing  # and it survives the state file's JSON
    with pytest.raises(UsageError, match=r"status --timing"):
        shell.run_line_magic("gpu_offload", "status --frobnicate")
