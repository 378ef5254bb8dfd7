"""What a notebook user sees in a real Jupyter kernel when the magic refuses a cell: one message, as IPython
shows its own UsageError, and none of the magic's frames; a syntax error shows the line and a caret."""

from __future__ import annotations

import re
from typing import Any

import pytest

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CASES = {
    "wrong option": ("%%gpu_offload --gpuz 1\nx = 1", "`--gpuz` is not an option (did you mean --gpus?)"),
    "bad option value": ("%%gpu_offload --gpus two\nx = 1", "argument --gpus: 'two' is not a number of GPUs"),
    "syntax error": ("%%gpu_offload\nx = 1\nif x:\n    y = (1 +\nz = 3",
                     "Syntax error on line 4 of the cell: '(' was never closed"),
    "IPython syntax": ("%%gpu_offload\nx = 1\n!ls", "Line 3 of the cell is IPython syntax"),
    "unpicklable input": ("%%gpu_offload\nx = 1\nprint(lock)", "Input `lock` (type _thread.lock) cannot be sent"),
    "missing --in": ("%%gpu_offload --in nowhere\nx = 1", "there is no variable `nowhere` in the notebook"),
    "unknown subcommand": ("%gpu_offload nosuchsub", "%gpu_offload nosuchsub: unknown command"),
}


@pytest.fixture(scope="module")
def prepared(kernel: Any) -> Any:
    reply, _ = kernel.execute("import threading\nlock = threading.Lock()\nx = 'kept'")
    assert reply["status"] == "ok", reply
    return kernel


@pytest.mark.parametrize("case", CASES)
def test_a_refused_cell_shows_one_message_and_no_frame_of_the_magic(prepared: Any, case: str) -> None:
    cell, message = CASES[case]
    reply, outputs = prepared.execute(cell)
    assert reply["status"] == "error"
    errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
    streams = [m["content"]["text"] for m in outputs if m["msg_type"] == "stream"]
    assert len(errors) == 1 and not streams, outputs
    shown = ANSI.sub("", "\n".join(errors[0]["traceback"]))
    assert shown.count(message) == 1, shown
    # no traceback header, no frame: neither the magic's modules nor IPython's call of the magic
    assert "Traceback" not in shown and "File " not in shown and "run_cell_magic" not in shown, shown
    assert "gpu_offload" not in shown.replace("%%gpu_offload", "").replace("%gpu_offload", ""), shown
    _, printed = prepared.execute("print(x)")
    assert prepared.text(printed).strip() == "kept"  # nothing ran: the cell's `x = 1` did not land


def test_a_syntax_error_points_at_the_cells_line_with_a_caret(prepared: Any) -> None:
    reply, outputs = prepared.execute(CASES["syntax error"][0])
    (error,) = [m["content"] for m in outputs if m["msg_type"] == "error"]
    shown = [ANSI.sub("", line) for line in "\n".join(error["traceback"]).splitlines()]
    # as IPython shows a syntax error of its own: which cell and line, the line, a caret under the culprit
    assert shown[:3] == [f"  Cell In[{reply['execution_count']}], line 4", "    y = (1 +", "        ^"], shown
    assert shown[3].startswith("SyntaxError: Syntax error on line 4 of the cell")
