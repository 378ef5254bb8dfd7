"""Which modules a one-shot runner imports ahead: only where no code of the cell runs before their import."""

from __future__ import annotations

import types

import pytest

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.preimport import chosen


@pytest.mark.parametrize(("cell", "ahead"), [
    ("import torch\nprint(torch.__version__)", ("torch",)),
    ('"""Train."""\nfrom __future__ import annotations\nimport os, sys\nimport numpy as np\nfrom torch import nn\nx = 1',
     ("torch",)),
    ("import torch.nn.functional as F\n", ("torch",)),
    ("x = 1", ()),
    ("import numpy as np\nx = np.zeros(3)", ()),
    # code of the cell runs first: it may set what torch reads when imported (OMP_NUM_THREADS, TORCH_LOGS, ...)
    ("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch", ()),
    # a module of the user's may do the same when imported
    ("import my_setup\nimport torch", ()),
    ("from . import local\nimport torch", ()),
    ("def f():\n    import torch\n", ()),
    ("if True:\n    import torch\n", ()),
])
def test_cell_imports(cell: str, ahead: tuple[str, ...]) -> None:
    assert chosen(analyse_cell(cell, {})) == ahead


def test_a_module_input_is_imported_ahead_unless_another_comes_first() -> None:
    torch_like = types.ModuleType("torch")
    mine = types.ModuleType("my_setup")
    assert chosen(analyse_cell("y = torch.ones(2)", {"torch": torch_like})) == ("torch",)
    assert chosen(analyse_cell("y = (s, torch)", {"s": mine, "torch": torch_like})) == ()
