"""A distributed cell inside a real Jupyter kernel: every rank's lines stream live; the kernel's interrupt
(Ctrl-C) stops every rank."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")


def test_the_kernels_interrupt_stops_every_rank_and_copies_nothing_back(kernel: Any) -> None:
    kernel.execute("x = 'before'")
    started: set[str] = set()

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            started.update(re.findall(r"\[rank (\d)\] started", msg["content"]["text"]))
            if len(started) == 4:
                started.add("interrupted")
                kernel.manager.interrupt_kernel()

    cell = (
        "%%gpu_offload --nodes 2 --procs-per-node 2 --gpus 0\nimport time\nx = 'after'\n"
        "print('started', flush=True)\ntime.sleep(300)"
    )
    reply, outputs = kernel.execute(cell, on_output)
    assert "interrupted" in started
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    _, outputs = kernel.execute("print(x)")
    assert kernel.text(outputs).strip() == "before"
    # no launcher or rank is left: the autouse fixture no_runner_left_behind checks it


def test_every_ranks_lines_reach_the_client_while_the_ranks_still_run(kernel: Any, tmp_path: Path) -> None:
    flag = tmp_path / "all-seen"
    # every rank waits until the test has received the first line of all four: output held back until the
    # end would leave them waiting 60 s, then print "not streamed"
    cell = (
        f"%%gpu_offload --nodes 2 --procs-per-node 2 --gpus 0\nimport os, time\nprint('first line', flush=True)\n"
        f"deadline = time.time() + 60\nwhile not os.path.exists({str(flag)!r}) and time.time() < deadline:\n"
        f"    time.sleep(0.01)\nprint('second line' if os.path.exists({str(flag)!r}) else 'not streamed')"
    )
    seen: set[str] = set()

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            seen.update(re.findall(r"\[rank (\d)\] first line", msg["content"]["text"]))
            if len(seen) == 4:
                flag.touch()

    reply, outputs = kernel.execute(cell, on_output)
    assert reply["status"] == "ok", reply
    text = kernel.text(outputs)
    for rank in range(4):
        assert f"[rank {rank}] second line" in text


def test_an_interrupted_distributed_session_keeps_every_ranks_state(kernel: Any) -> None:
    line = "%%gpu_offload --nodes 2 --procs-per-node 2 --gpus 0 --session ranks\n"
    # a generator cannot travel back to the notebook: it lives in each rank only
    reply, _ = kernel.execute(line + "import os, time\nticks = (int(os.environ['RANK']) * 10 + i for i in range(9))")
    assert reply["status"] == "ok", reply
    waiting: set[str] = set()

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            waiting.update(re.findall(r"\[rank (\d)\] waiting", msg["content"]["text"]))
            if len(waiting) == 4:
                waiting.add("interrupted")
                kernel.manager.interrupt_kernel()

    reply, _ = kernel.execute(line + "print('waiting', flush=True)\ntime.sleep(300)", on_output)
    assert "interrupted" in waiting
    assert reply["ename"] == "KeyboardInterrupt", reply
    reply, outputs = kernel.execute(line + "print('tick', next(ticks))")
    assert reply["status"] == "ok", reply
    for rank in range(4):
        assert f"[rank {rank}] tick {rank * 10}" in kernel.text(outputs)
    kernel.execute("%gpu_offload close ranks")
