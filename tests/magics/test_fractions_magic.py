"""Part of a GPU and ``--estimate`` through the magic in a real IPython shell, on the local backend with the real
runner: what the runner is told is what the cell asked for or what the estimate says."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

pytestmark = pytest.mark.e2e  # starts runners


def _notices(captured: Any) -> str:
    return "\n".join(str(o.data.get("text/plain", "")) for o in captured.outputs)


def test_half_a_gpu_and_a_memory_size_reach_the_runner(shell: Any) -> None:
    shell.run_cell_magic("gpu_offload", "--gpus 0.5 --gpu-memory 6Gi",
                         "import os\nseen = (os.environ.get('GPU_OFFLOAD_GPU_FRACTION'), "
                         "os.environ.get('GPU_OFFLOAD_GPU_MEMORY_LIMIT'))")
    assert shell.user_ns["seen"] == ("0.5", str(6 * 2**30))


@pytest.mark.parametrize(("line", "message"), [
    ("--gpus 1.5", r"--gpus 1.5 mixes whole GPUs and a fraction"),
    ("--gpus 0.5 --nodes 2", r"--gpus 0.5 with --nodes: the ranks of a distributed run each hold whole GPUs"),
    ("--gpu-memory lots", r"--gpu-memory 'lots' is not a size of memory"),
])
def test_a_fraction_that_cannot_be_launches_nothing(shell: Any, backend: Any, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        shell.run_cell_magic("gpu_offload", line, "x = 1")
    assert backend.submitted == []


def test_estimate_asks_for_what_the_model_needs_and_tells_the_runner(shell: Any) -> None:
    torch = pytest.importorskip("torch")
    from gpu_offload.engine.estimate import estimate_training_step

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    shell.user_ns.update(model=model, batch=torch.zeros(32, 64))
    with capture_output() as captured:
        shell.run_cell_magic("gpu_offload", "--estimate",
                             "import os\nmodel(batch).sum().backward()\nlimit = os.environ['GPU_OFFLOAD_GPU_MEMORY_LIMIT']")
    wanted = estimate_training_step(model, shell.user_ns["batch"]).request()
    assert shell.user_ns["limit"] == str(wanted)
    assert "asking for " in _notices(captured) and "(estimate: peak" in _notices(captured)


def test_estimate_without_a_model_says_what_to_do_and_launches_nothing(shell: Any, backend: Any) -> None:
    pytest.importorskip("torch")
    shell.user_ns["x"] = 3
    with pytest.raises(UsageError, match=r"--estimate: the cell reads no torch.nn.Module"):
        shell.run_cell_magic("gpu_offload", "--estimate", "y = x + 1")
    assert backend.submitted == []


def test_a_training_cell_without_estimate_is_told_its_estimate_and_runs_as_asked(shell: Any) -> None:
    torch = pytest.importorskip("torch")
    from gpu_offload.engine.estimate import estimate_training_step

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    shell.user_ns.update(model=model, batch=torch.zeros(32, 64))
    with capture_output() as captured:
        shell.run_cell_magic("gpu_offload", "--gpus 1",
                             "import os\nmodel(batch).sum().backward()\n"
                             "limit = os.environ.get('GPU_OFFLOAD_GPU_MEMORY_LIMIT')")
    assert shell.user_ns["limit"] is None  # a whole GPU, as asked: the estimate is said, not imposed
    wanted = estimate_training_step(model, shell.user_ns["batch"])
    assert (f"this cell trains a torch model and needs {wanted.describe()}; it asks for 1 whole GPU: --estimate "
            "asks for just what it needs") in _notices(captured)
