"""A one-shot runner imports the modules named by ``--preimport`` while its bundle is on its way, and the cell
sees the same module, the same warnings and the same errors as when it imports them itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_offload.runner.bundle import encode_bundle
from gpu_offload.runner.frames import Done, Error, Status, Stream

from .conftest import HANG_GUARD
from .test_runner_oneshot import loaded_outputs

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

SLOW_MODULE = '''
import os, threading, time, warnings
from pathlib import Path
IMPORTED_IN = threading.current_thread().name
SEEN_MPLBACKEND = os.environ.get("MPLBACKEND")
Path(os.environ["GPUO_TEST_MARKER"]).write_text("imported")
if os.environ.get("GPUO_TEST_BREAK"):
    raise ImportError("slowmod is broken here")
while os.environ.get("GPUO_TEST_HOLD"):  # an import that does not end (the test interrupts the wait for it)
    time.sleep(0.05)
warnings.warn("slowmod's old api", UserWarning)
'''


@pytest.fixture
def module_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python finds ``slowmod``, which says where and with what it was imported."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "slowmod.py").write_text(SLOW_MODULE)
    return {**os.environ, "PYTHONPATH": str(tmp_path / "mods"), "GPUO_TEST_MARKER": str(tmp_path / "marker")}


def run(write_bundle, start_runner, env: dict[str, str], cell: str, preimport: bool, **bundle: Any) -> Any:
    """The cell run one-shot with its bundle on stdin (as the backends send it), with or without --preimport
    slowmod; with it, the bundle is written only once the module was imported."""
    _, made = write_bundle(cell, **bundle)
    extra = ["--preimport", "slowmod"] if preimport else []
    runner = start_runner(Path("-"), made["nonce"], python=(sys.executable,), extra=extra, env=env,
                          stdin=subprocess.PIPE)
    if preimport:
        marker, deadline = Path(env["GPUO_TEST_MARKER"]), time.monotonic() + HANG_GUARD
        while not marker.exists():  # imported before the runner has its bundle
            assert time.monotonic() < deadline and runner.proc.poll() is None, "the module was not imported ahead"
            time.sleep(0.01)
        marker.unlink()
    runner.proc.stdin.write(encode_bundle(made))
    runner.proc.stdin.close()
    _, code = runner.finish()
    return runner, code


def test_the_cell_gets_the_module_imported_ahead_as_its_own_import_would_find_it(
        write_bundle, start_runner, module_env) -> None:
    cell = "import slowmod\nwhere, backend = slowmod.IMPORTED_IN, slowmod.SEEN_MPLBACKEND\n"
    seen = {}
    for ahead in (True, False):
        runner, code = run(write_bundle, start_runner, module_env, cell, ahead, outputs=["where", "backend"])
        assert code == 0, runner.of(Error)
        seen[ahead] = loaded_outputs(runner)
        # the import's warning is the cell's, either way
        assert "UserWarning: slowmod's old api" in "".join(e.text for e in runner.of(Stream) if e.name == "stderr")
    assert seen[True]["where"] == "gpu-offload-preimport" and seen[False]["where"] == "MainThread"
    assert seen[True]["backend"] == seen[False]["backend"] is not None  # the runner's environment was set first


def test_a_module_input_imported_ahead(write_bundle, start_runner, module_env) -> None:
    runner, code = run(write_bundle, start_runner, module_env, "where = sm.IMPORTED_IN\n", True,
                       modules={"sm": "slowmod"}, outputs=["where"])
    assert code == 0, runner.of(Error)
    assert loaded_outputs(runner) == {"where": "gpu-offload-preimport"}


def test_a_failed_import_ahead_fails_the_cells_own_import_with_its_error(
        write_bundle, start_runner, module_env) -> None:
    cell = "print('before')\nimport slowmod\nprint('after')\n"
    failures = {}
    for ahead in (True, False):
        runner, code = run(write_bundle, start_runner, {**module_env, "GPUO_TEST_BREAK": "1"}, cell, ahead)
        (error,) = runner.of(Error)
        assert code == 1 and runner.stdout() == "before\n"  # the cell ran up to its import, and no further
        failures[ahead] = (error.ename, error.evalue, [line for line in error.traceback if "offloaded cell" in line])
    assert failures[True] == failures[False]
    assert failures[True][0] == "ImportError" and failures[True][1] == "slowmod is broken here"
    assert failures[True][2] and "line 3" in failures[True][2][0]  # the cell's own line (the magic's is 1)


def test_a_failed_module_input_ahead_is_named_as_without(write_bundle, start_runner, module_env) -> None:
    runner, code = run(write_bundle, start_runner, {**module_env, "GPUO_TEST_BREAK": "1"}, "x = 1\n", True,
                       modules={"sm": "slowmod"})
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "ImportError"
    assert "`slowmod` (`sm` in the notebook)" in error.evalue and "slowmod is broken here" in error.evalue


def test_ctrl_c_while_the_run_waits_for_the_import_interrupts_the_run(write_bundle, start_runner, module_env) -> None:
    _, made = write_bundle("import slowmod\nx = 1\n", outputs=["x"])
    runner = start_runner(Path("-"), made["nonce"], python=(sys.executable,), extra=["--preimport", "slowmod"],
                          env={**module_env, "GPUO_TEST_HOLD": "1"}, stdin=subprocess.PIPE)
    runner.proc.stdin.write(encode_bundle(made))
    runner.proc.stdin.close()
    runner.until(lambda e: isinstance(e, Status) and e.state == "importing modules")
    runner.proc.send_signal(signal.SIGINT)
    _, code = runner.finish()
    assert code == 130 and runner.of(Done)[-1].status == "interrupted"
    assert [e.ename for e in runner.of(Error)] == ["KeyboardInterrupt"]


@pytest.mark.parametrize("argv", [
    ["--bundle", "-", "--preimport", "torch;rm"],
    ["--bundle", "-", "--preimport", ""],
    ["--session", "--preimport", "torch"],
    ["--bundle", "-", "--rank", "0", "--preimport", "torch"],
])
def test_a_bad_preimport_gets_the_usage_line(runner_pyz, argv) -> None:
    done = subprocess.run([sys.executable, "-I", str(runner_pyz), *argv], capture_output=True, text=True,
                          timeout=HANG_GUARD, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "usage: runner.pyz" in done.stderr and "--preimport" in done.stderr
