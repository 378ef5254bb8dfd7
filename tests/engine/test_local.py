"""What the local backend gives a runner: the kernel's environment with the GPUs narrowed to ``--gpus``."""

from __future__ import annotations

import os

import pytest

from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.local_process import runner_environment, visible_devices


def test_gpus_take_the_first_of_the_kernels_own_devices() -> None:
    assert visible_devices(1, "2,3") == "2"
    assert visible_devices(2, " 5, 7 ,9") == "5,7"
    assert visible_devices(3, None) == "0,1,2"
    assert visible_devices(0, "0,1") == ""


def test_runner_environment_drops_the_kernels_inline_matplotlib_backend() -> None:
    kernel_env = {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "HOME": "/home/u"}
    env = runner_environment(RunRequest(gpus=1, env={"EXTRA": "1"}), kernel_env)
    assert "MPLBACKEND" not in env
    assert env["HOME"] == "/home/u" and env["EXTRA"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == os.getcwd()


def test_a_users_own_matplotlib_backend_is_kept() -> None:
    env = runner_environment(RunRequest(), {"MPLBACKEND": "agg"})
    assert env["MPLBACKEND"] == "agg"


@pytest.mark.e2e  # starts a process
def test_ipython_display_helpers_on_a_local_python_without_ipython() -> None:
    import sys

    from gpu_offload.engine.backends.local import LocalBackend

    from .kube.helpers import run_cell

    # the interpreter this venv was made from: no IPython (nor anything else of the venv) there
    backend = LocalBackend(python=getattr(sys, "_base_executable", sys.executable))
    user_ns: dict[str, object] = {}
    try:
        outcome, sink, _ = run_cell(backend, "from IPython.display import display, Markdown\n"
                                             "display(Markdown('**done**'))\nnote = Markdown('kept')", user_ns)
    finally:
        backend.close()
    assert outcome.status == "ok", outcome.error
    assert sink.displays == [{"text/markdown": "**done**", "text/plain": "<IPython.core.display.Markdown object>"}]
    from IPython.display import Markdown, display

    # back in the notebook, the names are IPython's own
    assert user_ns["display"] is display and type(user_ns["note"]) is Markdown


@pytest.mark.e2e  # starts processes
def test_a_cell_that_starts_with_import_torch_has_its_runner_import_it_ahead() -> None:
    from gpu_offload.engine.backends.local import LocalBackend

    from .kube.helpers import run_cell

    backend = LocalBackend()
    user_ns: dict[str, object] = {}
    argv = "args = open('/proc/self/cmdline').read().split(chr(0))\n"
    try:
        first, _, _ = run_cell(backend, "import torch\n" + argv + "total = torch.ones(3).sum().item()", user_ns)
        ahead = user_ns.get("args")
        second, _, _ = run_cell(backend, "import os\n" + argv, user_ns)
    finally:
        backend.close()
    assert first.status == "ok" and second.status == "ok", (first.error, second.error)
    assert user_ns["total"] == 3.0
    assert isinstance(ahead, list) and ahead[ahead.index("--preimport") + 1] == "torch"
    assert "--preimport" not in user_ns["args"]  # a cell that does not import torch: nothing ahead
