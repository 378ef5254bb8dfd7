"""``from IPython.display import display, HTML, Markdown, Image`` in a cell, on an interpreter without IPython:
the runner answers the import, and the notebook gets what IPython itself would have sent."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpu_offload.runner import buffers
from gpu_offload.runner.frames import DisplayData, Error, Outputs

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

PNG = b"\x89PNG\r\n\x1a\n" + b"not really a picture"
CELL = (
    "from IPython.display import display, HTML, Markdown, Image, Math, JSON\n"
    "import IPython\n"
    "print(IPython.get_ipython())\n"
    "display(HTML('<b>bold</b>'), Markdown('*it*'))\n"
    "display(Image(png, width=20, alt='a dot'), Math('x^2'), JSON({'a': [1, 2]}))\n"
    "display(Image(url='https://example.org/a.png', height=5))\n"
    "kept = HTML('<i>kept</i>', metadata={'isolated': True})\n"
    "Image(data=png)\n"
)
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def shown(write_bundle: Any, start_runner: Any, python: tuple[str, ...]) -> tuple[list[Any], Any, str]:
    path, bundle = write_bundle(CELL, inputs={"png": PNG}, outputs=["kept", "display", "IPython"])
    runner = start_runner(path, bundle["nonce"], python=python)
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    (outputs,) = runner.of(Outputs)
    values = buffers.load_packed(outputs.pickle, outputs.buffers)
    import IPython.display

    # the names the cell imported come back as IPython's own, which the kernel has
    assert values["display"] is IPython.display.display and values["IPython"] is IPython
    kept = values["kept"]
    return [(e.data, e.metadata) for e in runner.of(DisplayData)], kept, runner.stdout()


def test_a_stock_interpreter_shows_what_ipython_would(write_bundle: Any, start_runner: Any) -> None:
    pytest.importorskip("IPython")
    # -S: nothing installed at all (no IPython), as in python:3.11-slim
    without, kept_without, printed = shown(write_bundle, start_runner, (BASE_PYTHON, "-I", "-S"))
    with_ipython, kept_with, _ = shown(write_bundle, start_runner, (sys.executable, "-I"))
    assert without == with_ipython  # the same MIME bundles and metadata, object by object
    assert printed == "None\n"  # no IPython shell runs there
    assert [sorted(data) for data, _ in without] == [
        ["text/html", "text/plain"], ["text/markdown", "text/plain"], ["image/png", "text/plain"],
        ["text/latex", "text/plain"], ["application/json", "text/plain"], ["text/html", "text/plain"],
        ["image/png", "text/plain"]]
    assert without[0][0]["text/plain"] == "<IPython.core.display.HTML object>"
    assert without[2][1] == {"image/png": {"width": 20, "alt": "a dot"}}
    assert without[5][0]["text/html"] == '<img src="https://example.org/a.png" height="5"/>'
    # a display object the cell returns is IPython's own class in the kernel
    from IPython.display import HTML

    for kept in (kept_without, kept_with):
        assert type(kept) is HTML and kept._repr_html_() == ("<i>kept</i>", {"isolated": True})
