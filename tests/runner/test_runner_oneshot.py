"""The real zipapp, one-shot, on real bundles: what the engine (and so the notebook user) relies on."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpu_offload.runner import buffers
from gpu_offload.runner.frames import (
    MAX_FRAME_BYTES,
    DisplayData,
    Done,
    Error,
    Hello,
    Metrics,
    Outputs,
    RunnerWarning,
    Stopping,
    Stream,
)

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


def loaded_outputs(runner) -> dict:  # type: ignore[no-untyped-def]
    (outputs,) = runner.of(Outputs)
    return buffers.load_packed(outputs.pickle, outputs.buffers)


def test_output_streams_while_the_cell_still_runs(write_bundle, start_runner, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    cell = "import os, time\nprint('first')\nwhile not os.path.exists(flag):\n    time.sleep(0.01)\nprint('second')\n"
    path, bundle = write_bundle(cell, inputs={"flag": str(flag)})
    runner = start_runner(path, bundle["nonce"])
    runner.until(lambda e: isinstance(e, Stream) and "first" in e.text)
    # the cell is blocked until the flag exists, so this frame cannot have come from the end of the run
    assert runner.proc.poll() is None
    flag.touch()
    events, code = runner.finish()
    assert code == 0
    assert runner.stdout() == "first\nsecond\n"
    assert isinstance(runner.seen[0], Hello) and runner.seen[0].python == sys.version.split()[0]
    assert isinstance(events[-1], Done) and events[-1].status == "ok"


def test_c_level_and_subprocess_output_streams_in_order(write_bundle, start_runner) -> None:
    cell = (
        "import os, subprocess\n"
        "print('python')\n"
        "os.write(1, b'from C\\n')\n"
        "subprocess.run(['echo', 'from a subprocess'], check=True)\n"
        "os.write(2, b'to stderr\\n')\n"
        "try:\n    input()\nexcept EOFError:\n    print('stdin is closed, not the command channel')\n"
    )
    path, bundle = write_bundle(cell)
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0
    assert runner.stdout() == "python\nfrom C\nfrom a subprocess\nstdin is closed, not the command channel\n"
    assert "to stderr\n" in [e.text for e in runner.of(Stream) if e.name == "stderr"]


def test_printed_frame_lines_arrive_as_text_even_with_the_real_nonce(write_bundle, start_runner) -> None:
    nonce = secrets.token_hex(16)
    # the worst case: a cell that knows the run's nonce prints a well-formed `done` frame, twice
    fake = f"\x1egpuo {nonce} 3 - 0 done " + json.dumps({"status": "ok", "elapsed": 0})
    path, bundle = write_bundle(
        "print(fake)\nimport os\nos.write(1, (fake + '\\n').encode())\nprint('after')",
        inputs={"fake": fake},
        nonce=nonce,
    )
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0
    assert runner.stdout() == f"{fake}\n{fake}\nafter\n"
    assert len(runner.of(Done)) == 1 and runner.of(Done)[0].status == "ok"


def test_large_outputs_stay_under_the_line_limit(write_bundle, start_runner) -> None:
    cell = (
        "print('y' * 100_000)\n"
        "class Big:\n"
        "    def _repr_html_(self):\n"
        "        return '<p class=\"q\">' + 'é' * 30_000 + '</p>'\n"
        "display(Big())\n"
    )
    path, bundle = write_bundle(cell)
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0
    assert max(len(line) for line in runner.raw_lines) <= MAX_FRAME_BYTES
    assert runner.stdout() == "y" * 100_000 + "\n"
    (shown,) = runner.of(DisplayData)
    assert shown.data["text/html"] == '<p class="q">' + "é" * 30_000 + "</p>"


def test_traceback_points_at_cell_lines_and_keeps_earlier_output(write_bundle, start_runner) -> None:
    cell = (
        "print('before')\ndef check(v):\n    raise ValueError(f'bad value {v}')\ncheck(7)\nprint('never')\n"
    )
    path, bundle = write_bundle(cell, first_line=2, filename="<offloaded cell 5>", outputs=["check"])
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 1
    assert runner.stdout() == "before\n"
    (error,) = runner.of(Error)
    assert runner.of(Stream)[0].seq < error.seq  # output before the failure comes first
    assert (error.ename, error.evalue) == ("ValueError", "bad value 7")
    text = "".join(error.traceback)
    # body line 4 of the cell is notebook line 5 (the %%gpu_offload line is line 1)
    assert 'File "<offloaded cell 5>", line 5, in <module>\n    check(7)' in text
    assert 'File "<offloaded cell 5>", line 4, in check' in text
    assert "gpo_runner" not in text and "runpy" not in text
    assert runner.of(Outputs) == [] and runner.of(Done)[-1].status == "error"


def test_syntax_errors_name_the_notebook_line(write_bundle, start_runner) -> None:
    path, bundle = write_bundle("x = 1\ny = (\n", first_line=2)
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "SyntaxError"
    assert "line 3" in "".join(error.traceback)


@pytest.mark.parametrize(
    "line",
    ["%timeit x", "!ls -l", "files = !ls", "  %matplotlib inline"],
)
def test_ipython_syntax_is_a_usage_error_naming_the_line(write_bundle, start_runner, line: str) -> None:
    path, bundle = write_bundle(f"x = 1\n{line}\nprint('not run')\n", first_line=2)
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "UsageError"
    assert f"line 3: `{line.strip()}`" in error.evalue
    assert runner.stdout() == ""


def test_outputs_round_trip_numpy_and_notebook_defined_code(
    write_bundle, start_runner, tmp_path: Path
) -> None:
    cell = (
        "import numpy as np\n"
        "arr = base * 2\n"
        "def square(v):\n    return v * v\n"
        "class Point:\n    def __init__(self, x):\n        self.x = x\n"
        "p = Point(add_one(2))\n"
    )
    path, bundle = write_bundle(
        cell,
        inputs={"base": np.arange(1_000_000.0), "add_one": lambda v: v + 1},
        outputs=["arr", "square", "Point", "p"],
        shm_dir=str(tmp_path),
    )
    assert any(ref["kind"] == "shm" for ref in bundle["buffers"])
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    (outputs,) = runner.of(Outputs)
    assert outputs.names == ("arr", "square", "Point", "p")
    assert [ref["kind"] for ref in outputs.buffers] == ["shm"]
    values = buffers.load_packed(outputs.pickle, outputs.buffers)
    np.testing.assert_array_equal(values["arr"], np.arange(1_000_000.0) * 2)
    assert values["square"](4) == 16
    assert isinstance(values["p"], values["Point"]) and values["p"].x == 3
    assert not list(tmp_path.glob("gpuo-*"))  # every shared-memory file was unlinked by its reader


def test_torch_tensors_round_trip(write_bundle, start_runner) -> None:
    torch = pytest.importorskip("torch")
    cell = "import torch\nt = weights @ torch.eye(3)\nstate = {'w': t.clone(), 'step': 2}\n"
    path, bundle = write_bundle(
        cell, inputs={"weights": torch.arange(9.0).reshape(3, 3)}, outputs=["t", "state"]
    )
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    values = loaded_outputs(runner)
    assert torch.equal(values["t"], torch.arange(9.0).reshape(3, 3))
    assert values["state"]["step"] == 2 and values["state"]["w"].shape == (3, 3)


def test_unpicklable_output_is_skipped_with_a_warning(write_bundle, start_runner) -> None:
    path, bundle = write_bundle("gen = (i for i in range(3))\nok = 1\n", outputs=["gen", "ok"])
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0
    (warning,) = runner.of(RunnerWarning)
    assert "`gen`" in warning.text and "generator" in warning.text and "skipped" in warning.text
    assert loaded_outputs(runner) == {"ok": 1}


def test_unpicklable_required_output_is_an_error(write_bundle, start_runner, tmp_path: Path) -> None:
    cell = "import numpy as np\nbig = np.ones(100_000)\ngen = (i for i in range(3))\n"
    path, bundle = write_bundle(cell, outputs=["big", "gen"], required_outputs=["gen"], shm_dir=str(tmp_path))
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 1
    (error,) = runner.of(Error)
    assert error.ename == "PicklingError" and "`gen`" in error.evalue and "--out" in error.evalue
    assert runner.of(Outputs) == [] and runner.of(Done)[-1].status == "error"
    assert not list(tmp_path.glob("gpuo-*"))


def test_missing_required_output_says_so(write_bundle, start_runner) -> None:
    path, bundle = write_bundle("x = 1\n", outputs=["x"], required_outputs=["y"])
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "NameError" and "--out y" in error.evalue


def test_python_prints_show_while_a_library_silences_fd_1(write_bundle, start_runner) -> None:
    # as in a notebook's own kernel, whose sys.stdout is not fd 1: a C library's output silenced by pointing
    # fd 1 at /dev/null stays silent, and the cell's own prints meanwhile still show
    cell = ("import os\nsaved = os.dup(1)\nos.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
            "os.write(1, b'from the library\\n')\nprint('from the cell')\nos.dup2(saved, 1)\nos.write(1, b'after\\n')\n")
    path, bundle = write_bundle(cell, first_line=2)
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0 and runner.stdout() == "from the cell\nafter\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_the_cell_keeps_output_and_sends_nothing_back(
    write_bundle, start_runner, signum
) -> None:
    cell = "import time\nx = 1\nprint('ready')\nwhile True:\n    time.sleep(0.05)\n"
    path, bundle = write_bundle(cell, outputs=["x"], first_line=2)
    runner = start_runner(path, bundle["nonce"])
    runner.until(lambda e: isinstance(e, Stream) and "ready" in e.text)
    runner.proc.send_signal(signum)
    _, code = runner.finish()
    assert code == 130
    assert runner.stdout() == "ready\n"
    (error,) = runner.of(Error)
    text = "".join(error.traceback)
    # wherever the signal lands (still returning from print, or in the loop), it is a line of the cell
    assert error.ename == "KeyboardInterrupt" and re.search(r'File "<offloaded cell 1>", line [456]', text)
    assert "gpo_runner" not in text and "signals.py" not in text  # no frame of the runner's own
    assert runner.of(Outputs) == [] and runner.of(Done)[-1].status == "interrupted"
    # no "pod being stopped" line: a one-shot pod gets SIGTERM from the kernel's own Ctrl-C as well
    assert runner.of(Stopping) == []


def test_display_shim_without_ipython(write_bundle, start_runner) -> None:
    cell = (
        "class Fancy:\n"
        "    def _repr_html_(self):\n        return '<b>fancy</b>'\n"
        "    def _repr_png_(self):\n        return b'\\x89PNG fake'\n"
        "display(Fancy())\n"
        "print('between')\n"
        "display('plain')\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\n"
        "plt.show()\n"
        "fig = plt.figure()\n"
        "plt.plot([3, 2, 1])\n"
        "1 + 1\n"
    )
    path, bundle = write_bundle(cell)
    runner = start_runner(path, bundle["nonce"], python=(sys.executable, "-I"))
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    # like IPython: the last expression's value, then the figures still open (flushed after the cell)
    fancy, plain, shown, result, leftover = runner.of(DisplayData)
    assert fancy.data["text/html"] == "<b>fancy</b>"
    assert base64.b64decode(fancy.data["image/png"]) == b"\x89PNG fake"
    (between,) = [e for e in runner.of(Stream) if e.text == "between\n"]
    assert fancy.seq < between.seq < plain.seq
    assert plain.data == {"text/plain": "'plain'"}
    for figure in (shown, leftover):  # plt.show(), then the figure still open at the end of the cell
        assert base64.b64decode(figure.data["image/png"]).startswith(b"\x89PNG\r\n")
    assert result.data == {"text/plain": "2"} and result.metadata.get("execute_result") is True
    assert not any("non-interactive" in e.text for e in runner.of(Stream))


def test_ipython_display_is_the_shim_where_ipython_is_installed(write_bundle, start_runner) -> None:
    pytest.importorskip("IPython")
    cell = "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))\n"
    path, bundle = write_bundle(cell)
    runner = start_runner(path, bundle["nonce"])  # this interpreter has IPython installed
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    (shown,) = runner.of(DisplayData)
    assert shown.data["text/html"] == "<b>hi</b>" and runner.stdout() == ""


def test_without_a_gpu_it_says_so_once(write_bundle, start_runner) -> None:
    path, bundle = write_bundle("x = 1")
    runner = start_runner(path, bundle["nonce"])
    runner.finish()
    hello = runner.seen[0]
    if isinstance(hello, Hello) and hello.gpus:
        pytest.skip("this machine has a GPU")
    (metrics,) = runner.of(Metrics)
    assert metrics.gpu == () and metrics.note == "no GPU visible, running on CPU"


def test_runs_on_a_stock_interpreter_with_nothing_installed(write_bundle, start_runner) -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    cell = (
        "import importlib.util\nwhere = importlib.util.find_spec('cloudpickle').origin\nresult = twice(21)\n"
    )
    path, bundle = write_bundle(cell, inputs={"twice": lambda v: 2 * v}, outputs=["where", "result"])
    # -S: no site-packages at all, like a stock image without this project or cloudpickle
    runner = start_runner(path, bundle["nonce"], python=(base, "-I", "-S"))
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    values = loaded_outputs(runner)
    assert values["result"] == 42 and ".pyz" in values["where"]


def test_python_minor_mismatch_is_one_sentence(write_bundle, start_runner) -> None:
    other = Path("/root/.pyenv/versions/3.12.1/bin/python3.12")
    if not other.exists():
        pytest.skip("no Python 3.12 interpreter on this machine")
    path, bundle = write_bundle("x = 1", python="3.11")
    runner = start_runner(path, bundle["nonce"], python=(str(other), "-I", "-S"))
    _, code = runner.finish()
    assert code == 3
    hello = runner.seen[0]
    assert isinstance(hello, Hello) and hello.python.startswith("3.12.")
    (error,) = runner.of(Error)
    assert error.ename == "PythonVersionMismatch" and error.traceback == ()
    assert "3.12" in error.evalue and "3.11" in error.evalue and "\n" not in error.evalue
    assert error.evalue.endswith(".") and error.evalue.count(". ") == 0


def test_an_unreadable_bundle_is_refused_in_one_sentence(start_runner, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pkl"
    garbage.write_bytes(b"not a pickle")
    for path in (tmp_path / "missing.pkl", garbage):
        runner = start_runner(path, "0" * 32)
        events, code = runner.finish()
        assert code == 2 and events == []
        assert str(path) in runner.stderr()


def test_a_cell_calling_sys_exit_fails_the_cell_not_the_protocol(write_bundle, start_runner) -> None:
    path, bundle = write_bundle("import sys\nprint('bye')\nsys.exit(4)\n")
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "SystemExit" and error.evalue == "4"
    assert runner.stdout() == "bye\n" and runner.of(Done)[-1].status == "error"


def test_a_thread_the_cell_left_running_does_not_keep_the_runner_alive(write_bundle, start_runner) -> None:
    cell = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,)).start()\nx = 1\n"
    path, bundle = write_bundle(cell, outputs=["x"])
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()  # would hang (until the guard) if the runner waited for the thread
    assert runner.of(Done)[-1].status == "ok" and code == 0


def test_outputs_that_cannot_be_delivered_are_an_error_naming_the_place(
    write_bundle, start_runner, tmp_path
) -> None:
    cell = "import numpy as np\nbig = np.ones(100_000)\n"
    missing = tmp_path / "no-such-dir"
    path, bundle = write_bundle(cell, outputs=["big"], shm_dir=str(missing), input_transport="inline")
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "BufferTransportError"
    assert str(missing) in error.evalue and "shm_dir" in error.evalue
    assert runner.of(Outputs) == [] and runner.of(Done)[-1].status == "error"


@pytest.mark.parametrize("cell, factor", [("b = a\n", 1.0), ("a *= 2\nb = a\n", 2.0)])
def test_an_input_sent_back_is_not_copied_again(write_bundle, start_runner, tmp_path, cell, factor) -> None:
    path, bundle = write_bundle(
        cell, inputs={"a": np.arange(500_000.0)}, outputs=["b"], shm_dir=str(tmp_path)
    )
    (sent,) = bundle["buffers"]
    inode = Path(sent["path"]).stat().st_ino
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    (outputs,) = runner.of(Outputs)
    (back,) = outputs.buffers
    # the very pages the notebook wrote come back under a new name (the engine may delete the old one)
    assert back["path"] != sent["path"] and Path(back["path"]).stat().st_ino == inode
    buffers.discard(bundle["buffers"])  # what the engine does with its input references after the run
    values = buffers.load_packed(outputs.pickle, outputs.buffers)
    np.testing.assert_array_equal(values["b"], np.arange(500_000.0) * factor)
    assert not list(tmp_path.glob("gpuo-*"))


def test_module_inputs_are_imported_again_and_env_is_applied(write_bundle, start_runner) -> None:
    cell = "import os\nroot = m.sqrt(16)\nflavour = os.environ['GPUO_TEST_FLAVOUR']\n"
    path, bundle = write_bundle(
        cell, modules={"m": "math"}, env={"GPUO_TEST_FLAVOUR": "mint"}, outputs=["root", "flavour"]
    )
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    assert loaded_outputs(runner) == {"root": 4.0, "flavour": "mint"}


def test_a_module_missing_where_the_cell_runs_is_named(write_bundle, start_runner) -> None:
    path, bundle = write_bundle("x = 1", modules={"pd": "no_such_module_here"})
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    (error,) = runner.of(Error)
    assert code == 1 and error.ename == "ModuleNotFoundError"
    assert "`no_such_module_here` (`pd` in the notebook)" in error.evalue and "--image" in error.evalue


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_cell_that_closes_its_stdout_neither_spins_nor_hangs(write_bundle, start_runner, tmp_path) -> None:
    flag = tmp_path / "go"
    cell = (
        "import os, sys, time, pathlib\nprint('before', flush=True)\nos.close(1)\n"
        "print('closed', file=sys.stderr, flush=True)\n"
        "while not pathlib.Path(flag).exists():\n    time.sleep(0.05)\n"
    )
    path, bundle = write_bundle(cell, inputs={"flag": str(flag)})
    runner = start_runner(path, bundle["nonce"])
    runner.until(lambda e: isinstance(e, Stream) and e.name == "stderr")
    before = cpu_seconds(runner.proc.pid)
    time.sleep(1.0)  # a window to watch the idle runner in, not a speed claim
    used = cpu_seconds(runner.proc.pid) - before
    flag.touch()
    _, code = runner.finish()
    assert code == 0 and runner.stdout() == "before\n"
    # a reader looping on the closed pipe would burn a whole core in that window
    assert used < 0.5


def test_rich_reprs_with_numpy_numbers_and_nan_are_shown(write_bundle, start_runner) -> None:
    cell = (
        "import numpy as np\n"
        "class Stats:\n"
        "    def _repr_json_(self):\n        return {'mean': np.float32(1.5), 'missing': float('nan')}\n"
        "display(Stats())\n"
    )
    path, bundle = write_bundle(cell)
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    (shown,) = runner.of(DisplayData)
    assert shown.data["application/json"]["mean"] == "1.5"
    assert shown.data["application/json"]["missing"] != shown.data["application/json"]["missing"]  # NaN


@pytest.mark.parametrize(
    "argv",
    [[], ["--bogus"], ["--session", "--bundle", "x"], ["--bundle"], ["--session", "--parent-pid", "me"]],
)
def test_a_bad_command_line_gets_the_usage_line(runner_pyz, argv) -> None:
    done = subprocess.run(
        [sys.executable, "-I", str(runner_pyz), *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "usage: runner.pyz (--bundle PATH | --bundle - | --session) [--parent-pid PID]" in done.stderr


def test_outputs_through_presigned_urls(write_bundle, start_runner, store) -> None:
    urls = [f"{store}/bucket/run-1/out-{i}?sig=ok" for i in range(4)]
    path, bundle = write_bundle(
        "import numpy as np\nbig = np.arange(300_000.0)\nsmall = 'x'\n",
        outputs=["big", "small"],
        output_transport="url",
        output_urls=urls,
    )
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    (outputs,) = runner.of(Outputs)
    assert [(ref["kind"], ref["index"]) for ref in outputs.buffers] == [("url", 0)]
    values = buffers.load_packed(outputs.pickle, outputs.buffers)
    np.testing.assert_array_equal(values["big"], np.arange(300_000.0))
    assert values["small"] == "x"


def test_inline_outputs_travel_in_frames_under_the_limit(write_bundle, start_runner) -> None:
    # a log-only channel (a pod without object storage): everything inside the frames, split into parts
    path, bundle = write_bundle(
        "import numpy as np\nbig = np.arange(200_000.0)\n", outputs=["big"], output_transport="inline"
    )
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0, runner.of(Error)
    assert max(len(line) for line in runner.raw_lines) <= MAX_FRAME_BYTES
    assert sum(b" part " in line for line in runner.raw_lines) > 50
    (outputs,) = runner.of(Outputs)
    assert outputs.buffers == ()
    np.testing.assert_array_equal(buffers.load_packed(outputs.pickle, [])["big"], np.arange(200_000.0))
