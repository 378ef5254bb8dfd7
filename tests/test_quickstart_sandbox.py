"""`gpu-offload quickstart`, the README's first command: the example notebook, unchanged, runs on the
kubernetes backend against the embedded sandbox, every offloaded cell says where its pod ran, and nothing
the command started is left running."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from gpu_offload.sandbox.kubelet import process

from gpu_offload.cli import main

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
PLACED = re.compile(r"gpu_offload: running in pod (gpuo-[a-z0-9-]+) on virtual node (donor-\d-gpu) "
                    r"\(Liqo cluster (donor-\d), 1 x A100\)")


def test_quickstart_runs_the_unchanged_example_on_sandbox_donors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # settings of the user's real deployment must not reach the sandbox's kernel
    monkeypatch.setenv("GPU_OFFLOAD_SERVICE_URL", "http://127.0.0.1:9/services/gpu-offload/")
    monkeypatch.setenv("GPU_OFFLOAD_BACKEND", "local")
    monkeypatch.setenv("AWS_PROFILE", "a-profile-this-machine-does-not-have")
    before = NOTEBOOK.read_bytes()
    others = set(process.live_processes())  # the pods of sandboxes other tests keep running
    target = tmp_path / "executed.ipynb"
    assert main(["quickstart", "--output", str(target)]) == 0
    printed = capsys.readouterr()
    assert NOTEBOOK.read_bytes() == before
    assert "SANDBOX" in printed.out and "no real GPU" in printed.out
    executed = nbformat.read(target, as_version=4)
    offloaded = [c for c in executed.cells if c.cell_type == "code" and c.source.startswith("%%gpu_offload")]
    assert len(offloaded) == 5
    for cell in offloaded:
        # the magic's notices: one plain-text display output under the cell (not stderr)
        said = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs
                       if o["output_type"] == "display_data")
        match = PLACED.search(said)
        assert match, f"no placement line under {cell.source.splitlines()[0]!r}: {said!r}"
        assert match.group(2) == f"{match.group(3)}-gpu"
        assert match.group(0) in printed.out  # shown beside the output as it arrived
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert not [o for o in outputs if o["output_type"] == "error"], text
    assert "total in the notebook: 45" in text and "step 2" in text
    assert "ndarray (1000000,) float64" in text  # 8 MB in and out through the sandbox's S3 store
    assert "counter on the runner: 2" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # matplotlib in the runner's image
    assert "embedded local backend" not in text
    assert not set(process.live_processes()) - others
