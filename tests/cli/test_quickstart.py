"""`gpu-offload quickstart --local` executes the example notebook in a real kernel through nbclient."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from gpu_offload.cli import main

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


def outputs_of(notebook: nbformat.NotebookNode) -> list[dict]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


def test_quickstart_runs_the_example_and_writes_the_executed_notebook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "executed.ipynb"
    assert main(["quickstart", "--local", "--output", str(target)]) == 0
    printed = capsys.readouterr().out
    assert "step 0" in printed and "step 2" in printed
    executed = nbformat.read(target, as_version=4)
    text = "".join(o.get("text", "") for o in outputs_of(executed) if o["output_type"] == "stream")
    assert "total in the notebook: 45" in text
    assert "ndarray (1000000,) float64" in text
    assert "counter on the runner: 2" in text
    assert any("image/png" in o.get("data", {}) for o in outputs_of(executed))
    assert not [o for o in outputs_of(executed) if o["output_type"] == "error"]


def test_quickstart_exits_non_zero_when_a_cell_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "broken.ipynb"
    cells = [
        new_code_cell("%load_ext gpu_offload.magics"),
        new_code_cell("%%gpu_offload\nraise RuntimeError('boom')"),
    ]
    nbformat.write(
        new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}),
        source,
    )
    assert main(["quickstart", "--local", "--notebook", str(source), "--output", str(tmp_path / "out.ipynb")]) == 1
    assert "boom" in capsys.readouterr().err
    assert (tmp_path / "out.ipynb").is_file()
