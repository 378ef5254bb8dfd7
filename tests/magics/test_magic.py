"""The ``%%gpu_offload`` magic in a real IPython shell, on the local backend with the real runner."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_offload.engine.errors import InputNotSerializable, OffloadTimeout, RemoteError, RunnerDied

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


def notices(captured: Any) -> str:
    """The magic's notices: its one display output per cell (plain text), not the cell's stderr."""
    return "\n".join(str(o.data.get("text/plain", "")) for o in captured.outputs)


def offload(shell: Any, cell: str, line: str = "") -> Any:
    return shell.run_cell_magic("gpu_offload", line, cell)


def test_variables_the_cell_assigns_come_back_and_its_prints_show(shell: Any) -> None:
    shell.user_ns["x"] = 21
    with capture_output() as captured:
        offload(shell, "y = x * 2\nprint('y is', y)")
    assert shell.user_ns["y"] == 42
    assert "y is 42" in captured.stdout


def test_a_function_defined_in_the_notebook_runs_on_the_runner(shell: Any) -> None:
    shell.run_cell("def double(v):\n    return v * 2\nbase = 5")
    offload(shell, "result = double(base) + 1")
    assert shell.user_ns["result"] == 11


def test_numpy_arrays_round_trip_and_modules_are_imported_again(shell: Any, backend: Any) -> None:
    shell.run_cell("import numpy as np\ndata = np.arange(300_000, dtype=np.float64)")
    offload(shell, "total = np.sum(data)\nsquares = data ** 2")
    assert shell.user_ns["total"] == pytest.approx(np.arange(300_000).sum())
    np.testing.assert_array_equal(shell.user_ns["squares"], np.arange(300_000, dtype=np.float64) ** 2)
    assert shell.user_ns["squares"].flags.writeable


def test_a_remote_exception_keeps_prior_output_and_leaves_variables_untouched(shell: Any) -> None:
    shell.user_ns["x"] = 5
    with capture_output() as captured, pytest.raises(RemoteError) as caught:
        offload(shell, "print('before the error')\nx = 10\n1 / 0")
    assert "before the error" in captured.stdout
    assert shell.user_ns["x"] == 5
    assert caught.value.ename == "ZeroDivisionError"
    rendered = "\n".join(caught.value._render_traceback_())
    assert "1 / 0" in rendered


def test_unknown_option_is_a_usage_error_suggesting_the_right_one(shell: Any, backend: Any) -> None:
    with pytest.raises(UsageError, match=r"`--gpu` is not an option \(did you mean --gpus\?\)"):
        offload(shell, "x = 1", "--gpu 2")
    assert backend.submitted == []


def test_negative_gpus_is_a_usage_error(shell: Any, backend: Any) -> None:
    with pytest.raises(UsageError, match=r"--gpus -1: the number of GPUs cannot be negative"):
        offload(shell, "x = 1", "--gpus -1")
    assert backend.submitted == []


def test_an_unpicklable_input_fails_before_launch_naming_it(shell: Any, backend: Any) -> None:
    shell.user_ns["lock"] = threading.Lock()
    shell.user_ns["x"] = 1
    with pytest.raises(InputNotSerializable, match=r"Input `lock` \(type _thread\.lock\) cannot be sent"):
        offload(shell, "x = 2\nwith lock:\n    pass")
    assert backend.submitted == []
    assert shell.user_ns["x"] == 1


def test_a_syntax_error_is_reported_locally_and_nothing_is_launched(shell: Any, backend: Any) -> None:
    with pytest.raises(UsageError, match=r"Syntax error on line 3 of the cell"):
        offload(shell, "x = 1\ny = (\n")
    with pytest.raises(UsageError, match=r"Line 2 of the cell is IPython syntax.*`!ls`"):
        offload(shell, "!ls\n")
    assert backend.submitted == []


@pytest.mark.parametrize(
    "ending, code", [("os._exit(7)", "exit code 7"), ("os.kill(os.getpid(), 9)", "signal 9")]
)
def test_a_runner_dying_mid_run_is_reported_with_its_exit_code(shell: Any, ending: str, code: str) -> None:
    shell.user_ns["x"] = 1
    with pytest.raises(RunnerDied, match=code):
        offload(shell, f"import os\nx = 2\n{ending}")
    assert shell.user_ns["x"] == 1


def test_the_kubernetes_backend_without_a_cluster_setting_is_a_usage_error(
    shell: Any, monkeypatch: Any
) -> None:
    monkeypatch.delenv("GPU_OFFLOAD_NAMESPACE", raising=False)
    with pytest.raises(
        UsageError, match=r"--backend kubernetes: GPU_OFFLOAD_NAMESPACE is not set.*--backend local"
    ):
        offload(shell, "x = 1", "--backend kubernetes")


def test_a_session_keeps_state_across_cells_and_closes(shell: Any) -> None:
    offload(shell, "hidden = object()\ncounter = 1", "--session s1")
    shell.user_ns.pop("hidden", None)
    offload(shell, "counter += 1\nsame = hidden is not None", "--session s1")
    assert shell.user_ns["counter"] == 2
    assert shell.user_ns["same"] is True
    with capture_output() as captured:
        shell.run_line_magic("gpu_offload", "sessions")
        shell.run_line_magic("gpu_offload", "close s1")
    assert "session s1: local pid" in captured.stdout
    assert "closed session s1" in captured.stdout
    with capture_output() as captured:
        shell.run_line_magic("gpu_offload", "sessions")
    assert "no sessions" in captured.stdout


def test_noblock_returns_a_handle_whose_result_loads_the_outputs(shell: Any) -> None:
    with capture_output() as captured:
        handle = offload(shell, "print('in the background')\nanswer = 42", "--noblock")
        values = handle.result()
    assert values == {"answer": 42}
    assert shell.user_ns["answer"] == 42
    assert handle.status == "ok"
    assert "in the background" in captured.stdout


def test_cancelling_a_noblock_run_copies_nothing_back(shell: Any) -> None:
    shell.user_ns["answer"] = "untouched"
    handle = offload(shell, "import time\nanswer = 1\ntime.sleep(300)", "--noblock")
    handle.cancel()
    with capture_output(), pytest.raises(KeyboardInterrupt):
        handle.result()
    assert handle.status == "cancelled"
    assert shell.user_ns["answer"] == "untouched"


def test_gpu_result_shows_the_last_noblock_run(shell: Any) -> None:
    offload(shell, "late = 'here'", "--noblock")
    with capture_output():
        shell.run_line_magic("gpu_result", "")
    assert shell.user_ns["late"] == "here"


def test_status_and_config_line_magics(shell: Any) -> None:
    with capture_output() as captured:
        shell.run_line_magic("gpu_offload", "config default_gpus=0")
        offload(shell, "x = 1")
        shell.run_line_magic("gpu_offload", "status")
    assert "default_gpus = 0" in captured.stdout
    assert "local backend" in captured.stdout
    assert "last run: ok" in captured.stdout
    assert "GPUs: none (CPU)" in captured.stdout
    with pytest.raises(UsageError, match=r"%gpu_offload frobnicate: unknown command"):
        shell.run_line_magic("gpu_offload", "frobnicate")


def test_a_runner_that_ignores_the_interrupt_is_killed_after_the_grace_period(
    shell: Any, tmp_path: Path
) -> None:
    shell.run_line_magic("gpu_offload", "config grace_period=0.5")
    shell.user_ns["x"] = "untouched"
    ready = tmp_path / "ready"
    cell = (
        "import pathlib, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nx = 'changed'\n"
        f"pathlib.Path({str(ready)!r}).touch()\nwhile True:\n    time.sleep(0.05)"
    )
    handle = offload(shell, cell, "--noblock")
    deadline = time.monotonic() + 120  # a hang guard, not a speed check
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.cancel()
    with capture_output() as captured, pytest.raises(KeyboardInterrupt):
        handle.result()
    assert "did not stop within 0.5 s of the interrupt; killing it" in notices(captured)
    assert shell.user_ns["x"] == "untouched"


def test_timeout_interrupts_the_cell_and_copies_nothing_back(shell: Any) -> None:
    shell.user_ns["x"] = "untouched"
    with pytest.raises(OffloadTimeout, match=r"longer than --timeout 1 s and was interrupted"):
        offload(shell, "import time\nx = 'changed'\ntime.sleep(300)", "--timeout 1")
    assert shell.user_ns["x"] == "untouched"


def test_a_quiet_start_says_what_the_run_is_waiting_for(shell: Any) -> None:
    shell.run_line_magic("gpu_offload", "config progress_after=0.01")
    with capture_output() as captured:
        offload(shell, "import time\ntime.sleep(1)\nprint('late')")
    assert "gpu_offload: no output yet after" in notices(captured)
    assert "late" in captured.stdout


def test_the_local_default_is_announced_once_per_kernel(shell: Any) -> None:
    shell.run_line_magic("gpu_offload", "config backend=auto")
    # two cells, as a notebook runs them (each its own execution count, so each its own notice output)
    with capture_output() as first:
        shell.run_cell("%%gpu_offload\na = 1", store_history=True)
    with capture_output() as second:
        shell.run_cell("%%gpu_offload\nb = 2", store_history=True)
    assert shell.user_ns["b"] == 2
    assert "no cluster is configured, so cells run on the embedded local backend" in notices(first)
    assert "embedded local backend" not in notices(second)
    assert "embedded local backend" not in first.stderr  # the cell's stderr stays the cell's


def test_rich_output_is_published_as_display_data(shell: Any) -> None:
    cell = "class Card:\n    def _repr_html_(self):\n        return '<b>card</b>'\ndisplay(Card())"
    with capture_output() as captured:
        offload(shell, cell)
    assert any(output.data.get("text/html") == "<b>card</b>" for output in captured.outputs)


def test_torch_tensors_round_trip(shell: Any) -> None:
    torch = pytest.importorskip("torch")
    shell.user_ns["torch"] = torch
    shell.user_ns["weights"] = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    offload(shell, "doubled = weights * 2", "--gpus 0")
    assert torch.equal(shell.user_ns["doubled"], torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2)


def test_a_session_cannot_change_its_gpus_without_closing(shell: Any) -> None:
    offload(shell, "v = 1", "--session fixed --gpus 1")
    with pytest.raises(
        UsageError, match=r"Session `fixed` was started with --gpus 1.*%gpu_offload close fixed"
    ):
        offload(shell, "v = 2", "--session fixed --gpus 2")
    shell.run_line_magic("gpu_offload", "close fixed")


@pytest.mark.parametrize("gpus, devices", [("2", "0,1"), ("0", "")])
def test_gpus_select_the_runners_visible_devices(
    shell: Any, gpus: str, devices: str, monkeypatch: Any
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    offload(shell, "import os\nseen = os.environ['CUDA_VISIBLE_DEVICES']", f"--gpus {gpus}")
    assert shell.user_ns["seen"] == devices


def test_cluster_only_options_are_named_as_ignored_on_the_local_backend(shell: Any) -> None:
    with capture_output() as captured:
        offload(shell, "x = 1", "--gpu-model A100 --image pytorch/pytorch:2.5.1 --cluster donor-1")
    assert "the local backend ignores --gpu-model, --image, --cluster" in notices(captured)
    assert shell.user_ns["x"] == 1


def test_priority_is_parsed_and_named_as_ignored_on_the_local_backend(shell: Any) -> None:
    with capture_output() as captured:
        offload(shell, "x = 2", "--priority batch")
    assert "the local backend ignores --priority: they choose where a cluster runs the cell" in notices(captured)
    assert shell.user_ns["x"] == 2


def test_idle_timeout_is_given_in_minutes_and_named_as_ignored_on_the_local_backend(shell: Any, backend: Any) -> None:
    with capture_output() as captured:
        offload(shell, "x = 3", "--session s --idle-timeout 0.5")
    # a local session holds no cluster's GPU: only a cluster backend releases it
    assert "the local backend ignores --idle-timeout: they choose where a cluster runs the cell" in notices(captured)
    assert backend.submitted[-1].request.idle_timeout == 30.0 and shell.user_ns["x"] == 3
    with pytest.raises(UsageError, match=r"--idle-timeout 5: only a session is released when idle"):
        offload(shell, "x = 4", "--idle-timeout 5")
    shell.run_line_magic("gpu_offload", "close s")


def test_an_interrupt_from_outside_is_an_error_not_a_silent_keyboard_interrupt(shell: Any) -> None:
    shell.user_ns["x"] = "untouched"
    cell = "import os, signal, time\nx = 'changed'\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(300)"
    with pytest.raises(RunnerDied, match=r"ended before finishing the cell"):
        offload(shell, cell)
    assert shell.user_ns["x"] == "untouched"


def test_an_unknown_configured_backend_is_a_usage_error_listing_the_choices(shell: Any, backend: Any) -> None:
    shell.run_line_magic("gpu_offload", "config backend=slurm")
    with pytest.raises(UsageError, match=r"backend `slurm` .* set it to auto, local or kubernetes"):
        offload(shell, "x = 1")
    assert backend.submitted == []


def test_a_session_whose_runner_died_says_so_when_it_starts_again(shell: Any, backend: Any) -> None:
    offload(shell, "import os\nremote_only = object()\npid = os.getpid()\ndel remote_only", "--session frail")
    os.kill(shell.user_ns["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60  # a hang guard; the backend itself must notice the death
    while backend.sessions() and time.monotonic() < deadline:
        time.sleep(0.01)
    with capture_output() as captured:
        offload(shell, "again = 1", "--session frail")
    assert "session `frail`'s runner had ended (exit code -9); this cell starts a new one" in notices(captured)
    assert shell.user_ns["again"] == 1
    shell.run_line_magic("gpu_offload", "close frail")
