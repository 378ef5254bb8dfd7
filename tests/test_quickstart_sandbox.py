"""`gpu-offload quickstart`, the README's first command: the example notebook, unchanged, runs on the
kubernetes backend against the embedded sandbox with queueing on (the sandbox's Kueue), every offloaded cell
says where its pod ran, and nothing the command started is left running. `examples/queueing.ipynb` run by the
same command shows a cell waiting in line (its place and Kueue's reason), a session preempted and resumed."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from gpu_offload.sandbox.kubelet import process

from gpu_offload.cli import main

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOK = EXAMPLES / "quickstart.ipynb"
# with queueing on, the flavor Kueue picked names the donor and the model
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
    assert "queueing   Kueue emulated" in printed.out and "LocalQueue gpu-offload in quickstart" in printed.out
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


def notices(cell: nbformat.NotebookNode) -> str:
    """The magic's lines under a cell, as the executed notebook keeps them."""
    return "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs if o["output_type"] == "display_data")


def test_the_queueing_example_waits_in_line_then_is_preempted_and_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    others = set(process.live_processes())
    target = tmp_path / "executed.ipynb"
    assert main(["quickstart", "--notebook", str(EXAMPLES / "queueing.ipynb"), "--output", str(target)]) == 0
    printed = capsys.readouterr().out
    executed = nbformat.read(target, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert not [o for o in outputs if o["output_type"] == "error"], text
    # the second cell waits behind the background one that holds donor-1: its place and Kueue's own reason
    waiting = next(c for c in code if "ran once donor-1 had a GPU free" in c.source)
    assert "gpu_offload: queued for 1 GPU: 1st of 1 in line; waiting" in printed
    assert ("Kueue: couldn't assign flavors to pod set main: flavor gpuo-donor-2-a100 doesn't match node affinity, "
            "insufficient unused quota for nvidia.com/gpu in flavor gpuo-donor-1-a100, 1 more needed") in printed
    assert "gpu_offload: admitted by Kueue after" in notices(waiting)
    # lines the magic adds to a cell's notices later (admitted, placed) reach the live output too: every line
    # of the written notebook's notices was printed (a wait's clock ticking is printed once, numbers aside)
    shown = {re.sub(r"\d+(\.\d+)?", "#", line) for line in printed.splitlines()}
    for cell in code:
        missed = [line for line in notices(cell).splitlines() if re.sub(r"\d+(\.\d+)?", "#", line) not in shown]
        assert not missed, (cell.source, missed)
    assert printed.count("gpu_offload: admitted by Kueue after") == sum(
        notices(cell).count("gpu_offload: admitted by Kueue after") for cell in code)  # once each
    # a cell pinned to donor-1 waits in Kueue too: its placement names the model of the flavor Kueue admitted
    assert re.search(r"running in pod gpuo-[a-z0-9-]+ on virtual node donor-1-gpu \(Liqo cluster donor-1, "
                     r"1 x A100\)", notices(waiting)), notices(waiting)
    assert "ran once donor-1 had a GPU free" in text and "held donor-1's four GPUs for 8 s" in text
    # the interactive cell took the batch session's GPUs; the session's next cell says so and resumes
    resumed = next(c for c in code if "steps += 1" in c.source)
    said = notices(resumed)
    assert re.search(r"session train: its pod gpuo-[a-z0-9]+ was preempted after \d+ s by a higher-priority run "
                     r"while idle; resumed on donor-1 \(waited [\d.]+ s for the pod, the restore took [\d.]+ s\); "
                     r"restored from checkpoint train: history, steps", said), said
    assert "steps 42 history [0.9, 0.5, 0.3]" in text
    assert not set(process.live_processes()) - others
