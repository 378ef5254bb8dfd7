"""The state directory is the user's alone: nothing written there follows a symlink, a directory of another
owner or open to others is refused (and tracking turns off), and every value of a record is escaped in the
panel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_offload.magics.dashboard.widget import run_cells

from gpu_offload.engine.backends.base import Job, RunRequest
from gpu_offload.engine.runs.records import RunBook, RunEntry, StateDirRefused
from gpu_offload.engine.runs.tracking import Tracker


def finished(run_id: str) -> RunEntry:
    return RunEntry(run_id, "kernel-a", os.getpid(), "local", "local", 1, state="done", ended=1.0)


def test_a_symlinked_state_file_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "runs"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    # where a record, its temporary file (the name a kernel would use) and a cancel request go
    for name in ("r1.json", f".r1.json.{os.getpid()}.tmp", "r1.cancel"):
        (state / name).symlink_to(victim)
    book = RunBook(state)
    book.write(finished("r1"))
    with pytest.raises(OSError):
        book.request_cancel("r1")
    assert victim.read_text() == "precious"
    assert not (state / "r1.json").is_symlink()
    assert [r.run_id for r in book.read_all()[0]] == ["r1"]
    assert not [p for p in state.iterdir() if p.name.startswith(".r1.json.") and not p.is_symlink()]


@pytest.mark.parametrize("how", ["mode 0777", "another owner", "a symlink"])
def test_a_state_dir_not_the_users_alone_is_refused_and_tracking_turns_off(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "runs"
    if how == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        state.symlink_to(tmp_path / "elsewhere")
    else:
        state.mkdir(mode=0o700)
        if how == "mode 0777":
            state.chmod(0o777)
        else:
            if os.geteuid() != 0:
                pytest.skip("giving a directory to another owner needs root")
            os.chown(state, 1000, 1000)
    book = RunBook(state)
    with pytest.raises(StateDirRefused, match=str(state)) as refused:
        book.write(finished("r1"))
    assert "chmod 700" in str(refused.value) and "GPU_OFFLOAD_STATE_DIR" in str(refused.value)
    records, problems = book.read_all()
    assert records == [] and str(state) in problems[0]

    tracker = Tracker(RunBook(state), kernel="k")
    record = tracker.new(Job("r2", "0" * 32, b"", RunRequest(gpus=0)), "local")
    tracker.put(finished(record.run_id))
    assert tracker.refused is not None and str(state) in tracker.refused
    assert "run tracking is off" in capsys.readouterr().err
    assert not [p for p in state.iterdir() if p.name.startswith(("r", ".r"))]  # nothing written there


def test_a_state_dir_it_creates_is_private_and_usable(tmp_path: Path) -> None:
    state = tmp_path / "new" / "runs"
    book = RunBook(state)
    book.write(finished("r1"))
    assert (state.stat().st_mode & 0o777) == 0o700
    assert [r.run_id for r in book.read_all()[0]] == ["r1"]


def test_every_value_of_a_record_is_escaped_in_the_panel() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    record = RunEntry(hostile, hostile, 1, hostile, hostile, hostile, state=hostile, detail=hostile,  # type: ignore[arg-type]
                      session=hostile, ended=1.0)
    html = run_cells(record, now=2.0)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
