"""A distributed cell inside a real Jupyter kernel: the kernel's interrupt (Ctrl-C) stops every rank."""

from __future__ import annotations

import re
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
