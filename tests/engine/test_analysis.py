"""What the magic sends and copies back is decided from the cell's syntax tree, before anything runs."""

from __future__ import annotations

import math
import threading

import pytest

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.errors import CellSyntaxError, OffloadUsageError


def test_sends_what_the_cell_reads_and_returns_what_it_assigns() -> None:
    namespace = {"a": 1, "b": 2, "unused": 3}
    result = analyse_cell("c = a + 1\nd = c * 2", namespace)
    assert result.inputs == ("a",)
    assert result.outputs == ("c", "d")


def test_modules_are_imported_again_by_name_not_pickled() -> None:
    result = analyse_cell("y = m.sqrt(x)", {"m": math, "x": 4.0})
    assert result.inputs == ("x",)
    assert dict(result.modules) == {"m": "math"}


def test_function_locals_and_comprehension_variables_are_not_inputs() -> None:
    namespace = {"x": 1, "i": 2, "scale": 3, "k": 4}
    cell = "def f(x, y=k):\n    z = x * scale\n    return z\nvalues = [i for i in range(3)]\n"
    result = analyse_cell(cell, namespace)
    assert set(result.inputs) == {"scale", "k"}
    assert result.outputs == ("f", "values")


def test_augmented_assignment_reads_the_old_value() -> None:
    assert analyse_cell("total += 1", {"total": 1}).inputs == ("total",)


def test_global_declared_in_a_function_is_an_output_and_except_names_are_not() -> None:
    cell = "def g():\n    global hits\n    hits = 1\ntry:\n    g()\nexcept Exception as err:\n    pass\n"
    result = analyse_cell(cell, {})
    assert set(result.outputs) == {"g", "hits"}


def test_ipython_internals_are_never_sent() -> None:
    result = analyse_cell("x = In[0] + value", {"In": ["a"], "value": "b"}, hidden={"In"})
    assert result.inputs == ("value",)


def test_in_and_out_extend_the_inferred_names() -> None:
    lock = threading.Lock()
    result = analyse_cell("exec('y = 1')", {"lock": lock}, extra_inputs=["lock"], extra_outputs=["y"])
    assert result.inputs == ("lock",)
    assert result.outputs == ("y",)
    assert result.required_outputs == ("y",)


def test_in_naming_a_missing_variable_says_how_to_fix_it() -> None:
    with pytest.raises(OffloadUsageError, match=r"--in ghost: there is no variable `ghost`.*Define it"):
        analyse_cell("pass", {}, extra_inputs=["ghost"])


@pytest.mark.parametrize(
    "cell, line, text",
    [
        ("x = 1\n!ls -l\n", 3, "!ls -l"),
        ("%timeit x\n", 2, "%timeit x"),
        ("y = 2\nfiles = !ls\n", 3, "files = !ls"),
    ],
)
def test_ipython_syntax_is_reported_with_its_line(cell: str, line: int, text: str) -> None:
    with pytest.raises(OffloadUsageError) as caught:
        analyse_cell(cell, {})
    message = str(caught.value)
    assert f"Line {line} of the cell is IPython syntax" in message
    assert f"`{text}`" in message
    assert "Nothing was launched" in message


def test_a_syntax_error_names_the_line_counting_the_magic_line_and_points_at_it() -> None:
    with pytest.raises(OffloadUsageError, match=r"Syntax error on line 4 of the cell: '\(' was never closed") as caught:
        analyse_cell("x = 1\nif x:\n    y = (\n", {})
    # as Python prints a syntax error: where, the line (indentation dropped), a caret under the culprit
    assert caught.value._render_traceback_()[:3] == ["  Cell, line 4", "    y = (", "        ^"]


def test_a_percent_sign_inside_a_string_is_not_ipython_syntax() -> None:
    result = analyse_cell('text = """\n%not a magic\n"""', {})
    assert result.outputs == ("text",)


def test_names_bound_by_imports_at_the_cells_level_are_known_with_what_they_import() -> None:
    cell = ("import numpy as np\nimport os.path\nfrom json import dumps as to_json, loads\nfrom . import sibling\n"
            "if True:\n    import time\ndef f():\n    import socket\nclass C:\n    import struct\n")
    assert analyse_cell(cell, {}).imports == {
        "np": ("numpy", None), "os": ("os", None), "to_json": ("json", "dumps"), "loads": ("json", "loads"),
        "time": ("time", None)}


def test_a_cell_run_again_is_analysed_against_the_namespace_as_it_is_now() -> None:
    # the syntax of a cell is kept per text; what its names are in the notebook is looked up at every run
    cell = "y = data + 1"
    namespace: dict[str, object] = {"data": 1}
    assert analyse_cell(cell, namespace).inputs == ("data",)
    namespace["data"] = math  # the same name is now a module: imported again, not pickled
    again = analyse_cell(cell, namespace)
    assert again.inputs == () and dict(again.modules) == {"data": "math"}
    del namespace["data"]  # gone from the notebook: nothing to send
    gone = analyse_cell(cell, namespace)
    assert gone.inputs == () and dict(gone.modules) == {}
    assert gone.outputs == ("y",)


def test_an_edited_cell_is_parsed_again() -> None:
    namespace = {"a": 1, "b": 2}
    assert analyse_cell("c = a", namespace).inputs == ("a",)
    edited = analyse_cell("c = b\nd = 1", namespace)
    assert edited.inputs == ("b",) and edited.outputs == ("c", "d")
    assert analyse_cell("c = a", namespace).outputs == ("c",)


def test_a_cell_that_does_not_parse_fails_at_every_run() -> None:
    for _ in range(2):
        with pytest.raises(CellSyntaxError):
            analyse_cell("x = (\n", {})


def test_a_kept_analysis_is_not_changed_by_its_users() -> None:
    first = analyse_cell("import os.path as p\nz = 1", {})
    first.imports["z"] = ("evil", None)  # type: ignore[index]  # a caller's dict of its own
    assert dict(analyse_cell("import os.path as p\nz = 1", {}).imports) == {"p": ("os.path", None)}
