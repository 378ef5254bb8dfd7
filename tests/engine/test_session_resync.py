"""A session whose run was not followed to its end stays in step: every later cell gets its own outputs.

Frames carry the run id; before each cell the session's reader expects the new run, so what an earlier run
sends late (its cell may still be running) is dropped and counted, never taken for the next cell's.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
from IPython.utils.capture import capture_output

from ..magics.test_magic import offload

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

DEEP = (
    "nested = []\n"
    "for _ in range(975):\n"
    "    nested = [nested]\n"
    "display({'application/json': {'a': nested}, 'text/plain': 'deep'}, raw=True)\n"
    "print('cell 1 done')\n"
)


def _notices(captured: Any) -> str:
    return "\n".join(str(o.data.get("text/plain", "")) for o in captured.outputs)


def three_cells(shell: Any, session: str) -> list[str]:
    shown = []
    for k in (2, 3, 4):
        with capture_output() as captured:
            offload(shell, f"print('cell {k}')\nv{k} = {k}\n", f"--session {session}")
        shown.append(captured.stdout + captured.stderr + _notices(captured))
    return shown


def test_a_975_level_display_then_three_cells_each_get_their_own_outputs(shell: Any) -> None:
    with capture_output() as captured:
        offload(shell, DEEP, "--session deep")
    assert "cell 1 done" in captured.stdout
    assert "nested deeper than 100 levels" in _notices(captured)
    shown = three_cells(shell, "deep")
    for k, text in zip((2, 3, 4), shown, strict=True):
        assert f"cell {k}" in text and all(f"cell {j}" not in text for j in (1, 2, 3, 4) if j != k), shown
        assert shell.user_ns[f"v{k}"] == k


class BrokenStdout(io.StringIO):
    """A front end that fails while showing the first cell's output."""

    def write(self, text: str) -> int:
        if "one-a" in text:
            raise OSError("the notebook's stdout went away")
        return super().write(text)


def test_a_run_abandoned_midway_does_not_put_the_session_off_by_one(shell: Any) -> None:
    slow = "import time\nprint('one-a', flush=True)\ntime.sleep(0.5)\nprint('one-b')\nx = 1\n"
    with contextlib.redirect_stdout(BrokenStdout()), pytest.raises(OSError, match="went away"):
        offload(shell, slow, "--session lag")
    shown = three_cells(shell, "lag")
    for k, text in zip((2, 3, 4), shown, strict=True):
        assert f"cell {k}" in text and "one-b" not in text, shown
        assert shell.user_ns[f"v{k}"] == k
    assert "frame(s) of an earlier cell" in shown[0]  # the first cell's late frames, counted and dropped
    with capture_output() as captured:
        offload(shell, "print('x is', x)\n", "--session lag")
    assert "x is 1" in captured.stdout  # the abandoned cell did finish in the session
