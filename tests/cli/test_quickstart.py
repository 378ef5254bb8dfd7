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


def test_quickstart_prints_the_lines_a_cell_adds_to_its_display_later_once_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # as the magic does with its notices: one display under the cell, updated in place with a line added and a
    # progress line replaced (its clock ticking, then a new place in line)
    source = tmp_path / "updates.ipynb"
    cell = (
        "from IPython.display import display\n"
        "shown = ['gpu_offload: queued for 1 GPU']\n"
        "handle = display({'text/plain': shown[0]}, raw=True, display_id=True)\n"
        "for progress in ('2nd of 2 in line; waiting 1 s', '2nd of 2 in line; waiting 2 s', '1st of 1 in line; "
        "waiting 3 s'):\n"
        "    handle.update({'text/plain': '\\n'.join([*shown, progress])}, raw=True)\n"
        "shown.append('gpu_offload: admitted by Kueue after 3 s')\n"
        "handle.update({'text/plain': '\\n'.join(shown)}, raw=True)\n"
    )
    nbformat.write(
        new_notebook(cells=[new_code_cell(cell)],
                     metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}),
        source,
    )
    target = tmp_path / "out.ipynb"
    assert main(["quickstart", "--local", "--notebook", str(source), "--output", str(target)]) == 0
    printed = capsys.readouterr().out
    [written] = [o for o in outputs_of(nbformat.read(target, as_version=4)) if o["output_type"] == "display_data"]
    assert written["data"]["text/plain"] == "gpu_offload: queued for 1 GPU\ngpu_offload: admitted by Kueue after 3 s"
    # every sentence the display held reaches the terminal once; the ticking clock does not repeat a line
    lines = printed.splitlines()
    assert lines.count("gpu_offload: queued for 1 GPU") == 1, printed
    assert lines.count("gpu_offload: admitted by Kueue after 3 s") == 1, printed
    assert [line for line in lines if "in line" in line] == ["2nd of 2 in line; waiting 1 s",
                                                             "1st of 1 in line; waiting 3 s"], printed
