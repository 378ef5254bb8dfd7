"""``gpu-offload runs --json`` lists a notebook cell's run from a real kernel and a script's run together."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpu_offload.engine.runs.tracking import WRITE_EVERY as RECORD_INTERVAL

from .helpers import cli, environment, write_project


def test_runs_lists_a_kernels_cell_and_a_script_together(kernel: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    # the kernel's tracker finds its state directory on its first offloaded cell
    reply, _ = kernel.execute(f"import os\nos.environ['GPU_OFFLOAD_STATE_DIR'] = {str(state)!r}")
    assert reply["status"] == "ok", reply
    reply, _ = kernel.execute("%%gpu_offload --gpus 0\nanswer = 6 * 7")
    assert reply["status"] == "ok", reply
    project = write_project(tmp_path / "proj")
    env = environment(state)
    assert cli(["run", "--backend", "local", "--gpus", "0", str(project)], tmp_path, env).returncode == 0
    # the kernel writes a finished cell's record with its next batch (docs/notebook.md: other processes see a
    # finished run up to one interval later), so the listing is read until the batch is due and a little more
    deadline = time.monotonic() + 10 * RECORD_INTERVAL
    while True:
        listed = cli(["runs", "--json"], tmp_path, env)
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        if len(rows) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(RECORD_INTERVAL / 5)
    assert [(r["kind"], r["state"], r["cluster"], r["gpus"]) for r in rows] == [
        ("script", "done", "local", 0), ("cell", "done", "local", 0)]  # newest first
    assert rows[0]["script"] == str(project) and rows[1]["script"] is None
    table = cli(["runs"], tmp_path, env).stdout.splitlines()
    assert table[0].split() == ["RUN", "KIND", "STATE", "CLUSTER", "GPUS", "AGE", "WHAT"]
    assert table[1].split()[1:5] == ["script", "done", "local", "0"] and table[1].endswith(str(project))
