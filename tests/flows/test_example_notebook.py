"""The example notebook runs its flow with Metaflow's NBRunner in a real kernel (local backend, CPU)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

NOTEBOOK = Path(__file__).resolve().parents[2] / "flows" / "examples" / "train_flow_notebook.ipynb"


def test_notebook_runs_the_flow_and_reads_its_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel, and the flow NBRunner starts from it, inherit this environment.
    for key, value in {
        "HOME": str(tmp_path),
        "USERNAME": "tester",
        "METAFLOW_DEFAULT_DATASTORE": "local",
        "METAFLOW_DEFAULT_METADATA": "local",
        "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(tmp_path),
        "METAFLOW_GPU_OFFLOAD_BACKEND": "local",
        "CUDA_VISIBLE_DEVICES": "",
    }.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "learned on cpu" in printed
    slope = float(printed.split("slope ")[1].split()[0])
    assert abs(slope - 3.0) < 0.1
