"""What the local backend gives a runner: the kernel's environment with the GPUs narrowed to ``--gpus``."""

from __future__ import annotations

import os

from gpu_offload.magics.backends.base import RunRequest
from gpu_offload.magics.backends.local import runner_environment, visible_devices


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
