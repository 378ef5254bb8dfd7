"""The cell's helper for ranks of different speeds travels in the runner: importable on a stock interpreter."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from gpu_offload.runner.frames import Error

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


def test_the_archive_carries_gpo_shards_as_a_top_level_module(runner_pyz: Path) -> None:
    names = set(zipfile.ZipFile(runner_pyz).namelist())
    assert {"gpo_shards.py", "gpo_shards.pyc"} <= names


def test_a_cell_on_a_stock_interpreter_imports_gpo_shards(write_bundle, start_runner) -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    cell = "import gpo_shards, sys\nprint(gpo_shards.apportion(10, [3.0, 1.0]), 'torch' in sys.modules)\n"
    path, bundle = write_bundle(cell)
    # -S: no site-packages (no gpu_offload, no torch), like a stock image; importing it needs no torch
    runner = start_runner(path, bundle["nonce"], python=(base, "-I", "-S"))
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    assert runner.stdout() == "[8, 2] False\n"
