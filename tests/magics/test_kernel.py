"""The magic inside a real Jupyter kernel: live streaming, the kernel's own interrupt, sessions surviving it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


def test_output_streams_to_the_client_while_the_cell_still_runs(kernel: Any, tmp_path: Path) -> None:
    flag = tmp_path / "seen"
    # The cell waits until the test has received its first line on iopub: if output were sent only at the
    # end, the cell would give up after 60 s and print "not streamed".
    cell = (
        f"%%gpu_offload\nimport os, time\nprint('first line')\ndeadline = time.time() + 60\n"
        f"while not os.path.exists({str(flag)!r}) and time.time() < deadline:\n    time.sleep(0.01)\n"
        f"print('second line' if os.path.exists({str(flag)!r}) else 'not streamed')"
    )

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "first line" in msg["content"]["text"]:
            flag.touch()

    reply, outputs = kernel.execute(cell, on_output)
    assert reply["status"] == "ok", reply
    assert "second line" in kernel.text(outputs)


def test_kernel_interrupt_stops_the_remote_cell_and_copies_nothing_back(kernel: Any) -> None:
    kernel.execute("x = 'before'")
    started = threading.Event()

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
            started.set()
            kernel.manager.interrupt_kernel()

    cell = "%%gpu_offload\nimport time\nx = 'after'\nprint('started', flush=True)\ntime.sleep(300)"
    reply, outputs = kernel.execute(cell, on_output)
    assert started.is_set()
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert "started" in kernel.text(outputs)
    _, outputs = kernel.execute("print(x)")
    assert kernel.text(outputs).strip() == "before"


def test_a_session_survives_an_interrupt_with_its_state(kernel: Any) -> None:
    reply, _ = kernel.execute("%%gpu_offload --session keep\nimport time\nkept = 41")
    assert reply["status"] == "ok", reply

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "waiting" in msg["content"]["text"]:
            kernel.manager.interrupt_kernel()

    reply, _ = kernel.execute(
        "%%gpu_offload --session keep\nprint('waiting', flush=True)\ntime.sleep(300)", on_output
    )
    assert reply["ename"] == "KeyboardInterrupt", reply
    reply, outputs = kernel.execute("%%gpu_offload --session keep\nprint(kept + 1)")
    assert reply["status"] == "ok", reply
    assert kernel.text(outputs).strip() == "42"
    kernel.execute("%gpu_offload close keep")


def test_remote_errors_reach_the_client_as_an_error_with_the_remote_traceback(kernel: Any) -> None:
    reply, outputs = kernel.execute("%%gpu_offload\nprint('partial')\nraise ValueError('bad value')")
    assert reply["status"] == "error"
    errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
    assert errors and "bad value" in "\n".join(errors[0]["traceback"])
    assert "partial" in kernel.text(outputs)
    # the cell's number and line as the notebook shows them (IPython 9 counts the next cell while one runs)
    assert f'<offloaded cell {reply["execution_count"]}>", line 3' in "\n".join(errors[0]["traceback"])


def test_a_killed_kernel_leaves_no_runner_behind() -> None:
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        client.execute_interactive("%load_ext gpu_offload.magics", timeout=60)
        reply = client.execute_interactive("%%gpu_offload --session orphan\nx = 1", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        # SIGKILL: the kernel cannot close its sessions; the runner's parent-death watchdog must end it
        manager.shutdown_kernel(now=True)


def test_the_magics_notices_are_one_quiet_output_per_cell_and_stderr_stays_the_cells(kernel: Any) -> None:
    """JupyterLab paints stderr red: the magic's own notices (here: no output yet, while the cell sleeps) go in
    one plain-text display output under the cell, updated in place, and stderr carries only what the cell wrote."""
    kernel.execute("%gpu_offload config progress_after=0.01")
    cell = "%%gpu_offload\nimport sys, time\ntime.sleep(1)\nprint('mine', file=sys.stderr)\nprint('late')"
    reply, outputs = kernel.execute(cell)
    assert reply["status"] == "ok", reply
    assert kernel.text(outputs, "stderr") == "mine\n"
    assert kernel.text(outputs) == "late\n"
    notices = [m for m in outputs if m["msg_type"] in ("display_data", "update_display_data")
               and m["content"]["data"].get("text/plain", "").startswith("gpu_offload: ")]
    assert notices and notices[0]["msg_type"] == "display_data"
    assert all(m["msg_type"] == "update_display_data" for m in notices[1:])  # one output, updated in place
    assert len({m["content"]["transient"]["display_id"] for m in notices}) == 1
    assert set(notices[-1]["content"]["data"]) == {"text/plain"}
    shown = notices[-1]["content"]["data"]["text/plain"]
    assert shown.count("no output yet after") == 1, shown  # the newest wait replaces the one before
    kernel.execute("%gpu_offload config progress_after=2")
