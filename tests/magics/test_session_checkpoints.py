"""A session's state survives: `%gpu_offload checkpoint|move|restore` and a lost runner, on the local backend.

The session holds numbers, a numpy array, a torch model with its Adam optimizer and a function defined in an
earlier cell; after a move or the runner being killed, the next cell sees the same values, and what could not
be checkpointed (a lock, a socket) is named. Each test leaves no runner and no checkpoint file behind.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_offload.engine.backends.local import LocalBackend

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

FIRST_CELL = """\
import socket, threading
import numpy as np
import torch
def scaled(v):
    return v * factor
factor = 3
steps = 7
arr = np.arange(50_000, dtype=np.float64)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad(); model(torch.ones(3, 4)).sum().backward(); opt.step()
lock = threading.Lock()
conn = socket.socket()
weights = model.weight.detach().tolist()
moment = opt.state[model.weight]["exp_avg"].tolist()
"""

CHECK_CELL = """\
same_steps = steps == 7 and scaled(2) == 6
same_arr = float(arr.sum()) == float(np.arange(50_000, dtype=np.float64).sum())
same_weights = model.weight.detach().tolist() == weights
same_moment = opt.state[model.weight]["exp_avg"].tolist() == moment
shared = opt.param_groups[0]["params"][0] is model.weight
opt.zero_grad(); model(torch.ones(3, 4)).sum().backward(); opt.step()
trained = model.weight.detach().tolist() != weights
"""


@pytest.fixture
def shell() -> Iterator[Any]:
    """A real IPython shell with the magic over the real local backend (its checkpoints included)."""
    from gpu_offload.magics.magic import GpuOffloadMagics
    from IPython.core.interactiveshell import InteractiveShell

    ipython = InteractiveShell.instance()
    ipython.reset()
    backend = LocalBackend()
    magics = GpuOffloadMagics(ipython, backends={"local": backend})
    magics.backend = "local"
    ipython.register_magics(magics)
    ipython.checkpoint_backend = backend
    yield ipython
    directory = backend.checkpoints._directory
    magics.close()
    assert directory is None or not directory.exists(), "checkpoint files left behind"


def offload(shell: Any, cell: str, line: str = "--session work") -> None:
    shell.run_cell_magic("gpu_offload", line, cell)


def line(shell: Any, text: str) -> str:
    with capture_output() as captured:
        shell.run_line_magic("gpu_offload", text)
    return captured.stdout


def notices(captured: Any) -> str:
    return "\n".join(str(o.data.get("text/plain", "")) for o in captured.outputs) + captured.stdout


def runner_pid(shell: Any, session: str = "work") -> int:
    return int(shell.checkpoint_backend._sessions[session].process.pid)


def lose_runner(shell: Any, session: str = "work") -> None:
    """Kill the session's runner between cells, as a preempted or deleted pod is, and wait until it is gone."""
    process = shell.checkpoint_backend._sessions[session].process
    os.kill(process.pid, signal.SIGKILL)
    process.popen.wait(10)


def assert_same_state(shell: Any) -> None:
    for name in ("same_steps", "same_arr", "same_weights", "same_moment", "shared", "trained"):
        assert shell.user_ns[name] is True, name


def test_a_checkpoint_names_what_was_saved_what_was_not_and_its_size_against_the_limit(shell: Any) -> None:
    offload(shell, FIRST_CELL)
    said = line(shell, "checkpoint work --limit 64")
    assert said.startswith("checkpoint work (session work): checkpoint ")
    for name in ("arr", "factor", "model", "opt", "scaled", "steps"):
        assert name in said.split("not saved")[0]
    assert "not saved: conn (socket.socket" in said and "lock (_thread.lock" in said
    assert "limit 64 MiB" in said
    saved = shell.checkpoint_backend.checkpoints.get("work")
    assert saved.manifest["format"] == "pickle" and saved.trusted
    assert stat.S_IMODE(saved.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(saved.path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(saved.path.parent.parent.stat().st_mode) == 0o700


def test_a_checkpoint_over_its_limit_is_refused_whole(shell: Any) -> None:
    offload(shell, "import numpy as np\nbig = np.zeros(3 * 2**20 // 8 * 2)")
    with pytest.raises(UsageError, match=r"over the checkpoint limit of 1 MiB; nothing was written"):
        line(shell, "checkpoint work --limit 1")
    assert shell.checkpoint_backend.checkpoints.saved == {}
    assert not list(Path(shell.checkpoint_backend.checkpoints._directory or "/nonexistent").glob("*"))


def test_an_explicit_move_brings_the_state_to_a_new_runner(shell: Any) -> None:
    offload(shell, FIRST_CELL)
    before = runner_pid(shell)
    said = line(shell, "move work")
    assert "restored from checkpoint work: " in said
    assert "not restored: conn (socket.socket" in said and "lock (_thread.lock" in said
    assert runner_pid(shell) != before
    offload(shell, CHECK_CELL)
    assert_same_state(shell)


def test_a_lost_runner_is_reported_and_the_session_resumes_from_its_last_checkpoint(shell: Any) -> None:
    offload(shell, FIRST_CELL)
    line(shell, "checkpoint work")
    lose_runner(shell)
    with capture_output() as captured:
        offload(shell, CHECK_CELL)
    said = notices(captured)
    assert "runner had ended (exit code -9)" in said
    assert "restored from checkpoint work: " in said and "not restored: conn" in said
    assert_same_state(shell)


def test_a_lost_runner_without_a_checkpoint_says_the_state_is_gone(shell: Any) -> None:
    offload(shell, "kept = 1")
    lose_runner(shell)
    shell.user_ns.pop("kept")
    with capture_output() as captured, pytest.raises(Exception, match="kept"):
        offload(shell, "print(kept)")
    assert "variables that lived only in the session are gone" in notices(captured)


def test_restore_into_another_session_and_never_over_a_running_one(shell: Any) -> None:
    offload(shell, FIRST_CELL)
    line(shell, "checkpoint work --as base")
    with pytest.raises(UsageError, match=r"session 'work' is running: close it first"):
        line(shell, "restore base")
    said = line(shell, "restore base --session copy")
    assert said.startswith("session copy: restored from checkpoint base: ")
    offload(shell, CHECK_CELL, "--session copy")
    assert_same_state(shell)
    with pytest.raises(UsageError, match=r"no checkpoint named 'nope' \(this kernel has: base\)"):
        line(shell, "restore nope")


def test_a_checkpoint_written_safely_is_restored_as_data_only(shell: Any, monkeypatch: Any) -> None:
    # the runner writes the safe format where it sends outputs safely: an untrusted donor's pod has this set
    monkeypatch.setenv("GPU_OFFLOAD_OUTPUT_FORMAT", "safe")
    # through exec: the cell sends nothing back (this kernel would refuse safe outputs from a local runner)
    offload(shell, f"exec({FIRST_CELL!r}, globals())")
    said = line(shell, "checkpoint work")
    monkeypatch.delenv("GPU_OFFLOAD_OUTPUT_FORMAT")
    assert "(safe)" in said and "scaled (function" in said
    saved = shell.checkpoint_backend.checkpoints.get("work")
    assert saved.manifest["format"] == "safe" and not saved.trusted
    said = line(shell, "restore work --session data")
    assert "restored from checkpoint work: arr, factor, moment, steps, weights;" in said
    not_restored = said.split("not restored: ")[1]
    for name in ("conn", "lock", "model", "opt", "scaled"):
        assert f"{name} (" in not_restored and "holds data only" in not_restored
    assert "np (module numpy: import it again" in not_restored
    offload(shell, "import numpy as np\nok = float(arr.sum()) == float(np.arange(50_000.0).sum()) and steps == 7",
            "--session data")
    assert shell.user_ns["ok"] is True


def test_a_checkpoint_changed_in_storage_is_refused(shell: Any) -> None:
    offload(shell, "value = 5")
    line(shell, "checkpoint work")
    saved = shell.checkpoint_backend.checkpoints.get("work")
    saved.path.write_bytes(saved.path.read_bytes() + b"tampered")
    with pytest.raises(UsageError, match=r"do not match its recorded sha256"):
        line(shell, "restore work --session other")
    assert "other" not in shell.checkpoint_backend._sessions


def test_automatic_checkpoints_after_each_cell_make_a_lost_runner_cost_at_most_the_last_cell(shell: Any) -> None:
    offload(shell, FIRST_CELL)
    said = line(shell, "checkpoint work --auto on --limit 256")
    assert "from now on written again in the background after every cell that ends ok" in said
    offload(shell, "steps = 8\nlater = scaled(10)")
    with capture_output() as captured:
        offload(shell, "seen = steps")  # the next cell is told what the background checkpoint did
    assert "automatic checkpoint after the last cell: work (session work): " in notices(captured)
    assert "limit 256 MiB" in notices(captured)
    shell.checkpoint_backend._sessions["work"].settle()  # the checkpoint after `seen = steps` is written
    lose_runner(shell)
    with capture_output() as captured:
        offload(shell, "resumed = (steps, later, seen)")
    assert "restored from checkpoint work: " in notices(captured)
    assert shell.user_ns["resumed"] == (8, 30, 8)


def test_an_automatic_checkpoint_over_its_limit_keeps_the_one_before_and_says_so(shell: Any) -> None:
    offload(shell, "steps = 1")
    line(shell, "checkpoint work --auto on --limit 1")
    offload(shell, "import numpy as np\nbig = np.ones(2**18)")  # 2 MiB: over the limit
    with capture_output() as captured:
        offload(shell, "steps = 2")
    assert "the automatic checkpoint after the last cell was not written" in notices(captured)
    assert "over the checkpoint limit of 1 MiB" in notices(captured)
