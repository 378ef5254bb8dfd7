"""The example training flow runs for real: locally on CPU (local backend), artifacts readable after."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "flows" / "examples" / "train_flow.py"


def test_train_flow_trains_on_cpu_without_a_cluster(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "train_flow.py")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "USERNAME": "tester",
        "METAFLOW_DEFAULT_DATASTORE": "local",
        "METAFLOW_DEFAULT_METADATA": "local",
        "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(tmp_path),
        "METAFLOW_GPU_OFFLOAD_BACKEND": "local",
        "CUDA_VISIBLE_DEVICES": "",
    }
    run = subprocess.run(
        [sys.executable, "train_flow.py", "run", "--epochs", "60"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )
    assert run.returncode == 0, run.stderr
    assert "trained on cpu" in run.stdout + run.stderr
    probe = (
        "import json; from metaflow import Flow, namespace; namespace(None); run = Flow('TrainFlow').latest_run;"
        "d = run['train'].task.data; print(json.dumps({'ok': run.successful, 'device': d.device,"
        " 'first': d.losses[0], 'last': d.losses[-1], 'n': len(d.losses), 'weights': sorted(d.weights)}))"
    )
    read = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert read.returncode == 0, read.stderr
    data = json.loads(read.stdout.strip().splitlines()[-1])
    assert data["ok"] is True and data["device"] == "cpu" and data["n"] == 60
    assert data["last"] < data["first"] / 2  # it learned something
    assert data["weights"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
