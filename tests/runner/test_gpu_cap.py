"""The runner's own cap on GPU memory when it holds part of a GPU, read from what the origin tells it."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from gpu_offload.liqo_peering import sharing

from gpu_offload.runner import gpu_cap


def test_the_runner_reads_the_names_the_origin_writes():
    assert (gpu_cap.SHARING, gpu_cap.ISOLATION, gpu_cap.MEMORY_LIMIT, gpu_cap.FRACTION) == (
        sharing.RUNNER_SHARING, sharing.RUNNER_ISOLATION, sharing.RUNNER_MEMORY_LIMIT, sharing.RUNNER_FRACTION)


def test_mps_gets_its_pinned_limit_and_a_pods_own_limit_is_kept():
    # NVIDIA's device plugin gives every container it lends MPS shares to the pipe directory
    env = {gpu_cap.SHARING: "mps", gpu_cap.MEMORY_LIMIT: str(40 * 2**30), gpu_cap.MPS_PIPE: "/tmp/nvidia-mps"}
    assert gpu_cap.install(env)
    assert env[gpu_cap.MPS_LIMIT] == "0=40960M"
    own = {**env, gpu_cap.MPS_LIMIT: "0=1000M"}
    gpu_cap.set_mps_limit(own)
    assert own[gpu_cap.MPS_LIMIT] == "0=1000M"
    sliced = {gpu_cap.SHARING: "time-slicing", gpu_cap.FRACTION: "0.5"}
    gpu_cap.set_mps_limit(sliced)
    assert gpu_cap.MPS_LIMIT not in sliced


def test_the_fraction_is_the_byte_limit_over_the_gpu_or_the_share_given():
    assert gpu_cap.memory_fraction({gpu_cap.MEMORY_LIMIT: str(20 * 2**30)}, 80 * 2**30) == 0.25
    assert gpu_cap.memory_fraction({gpu_cap.FRACTION: "0.5"}, 80 * 2**30) == 0.5
    assert gpu_cap.memory_fraction({gpu_cap.FRACTION: "junk"}, 80 * 2**30) is None
    assert not gpu_cap.install({})


@pytest.mark.e2e
def test_a_cell_importing_torch_on_a_machine_without_a_gpu_runs_uncapped():
    # a process of its own: the hook waits for the first import of torch, which this test process already did
    code = ("import os, sys; from gpu_offload.runner import gpu_cap; "
            "assert gpu_cap.install({'GPU_OFFLOAD_GPU_FRACTION': '0.5'}); import torch; "
            "assert not any(isinstance(f, gpu_cap._AfterTorch) for f in sys.meta_path); "
            "print(torch.cuda.is_available(), gpu_cap.cap_torch(torch, {'GPU_OFFLOAD_GPU_FRACTION': '0.5'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "None"]


def test_with_a_gpu_torch_gets_the_share_of_device_zero():
    # the calls torch.cuda offers, answering as an 80 GiB GPU would; what the runner asks of them is the test
    calls: list[tuple[float, int]] = []
    cuda = SimpleNamespace(is_available=lambda: True,
                           get_device_properties=lambda i: SimpleNamespace(total_memory=80 * 2**30),
                           set_per_process_memory_fraction=lambda f, d: calls.append((f, d)))
    torch = SimpleNamespace(cuda=cuda)
    assert gpu_cap.cap_torch(torch, {gpu_cap.MEMORY_LIMIT: str(20 * 2**30)}) == 0.25
    assert calls == [(0.25, 0)]
    assert gpu_cap.cap_torch(torch, {}) is None and len(calls) == 1


def test_the_mode_and_isolation_are_those_of_the_donor_the_pod_landed_on():
    # queued, the origin wrote one candidate's mode; the device plugin's answer says which donor took the pod
    assert {m: sharing.ISOLATION[m] for m in ("time-slicing", "mps")} == gpu_cap.ISOLATION_OF
    told_sliced_got_mps = {gpu_cap.SHARING: "time-slicing", gpu_cap.ISOLATION: "none",
                           gpu_cap.MEMORY_LIMIT: str(20 * 2**30), gpu_cap.MPS_PIPE: "/tmp/nvidia-mps"}
    assert gpu_cap.install(told_sliced_got_mps)
    assert told_sliced_got_mps[gpu_cap.SHARING] == "mps"
    assert told_sliced_got_mps[gpu_cap.ISOLATION] == "compute and memory"
    assert told_sliced_got_mps[gpu_cap.MPS_LIMIT] == "0=20480M"
    told_mps_got_sliced = {gpu_cap.SHARING: "mps", gpu_cap.ISOLATION: "compute and memory",
                           gpu_cap.MEMORY_LIMIT: str(20 * 2**30)}
    assert gpu_cap.install(told_mps_got_sliced)
    assert (told_mps_got_sliced[gpu_cap.SHARING], told_mps_got_sliced[gpu_cap.ISOLATION]) == ("time-slicing", "none")
    assert gpu_cap.MPS_LIMIT not in told_mps_got_sliced
    mig = {gpu_cap.SHARING: "mig", gpu_cap.ISOLATION: "compute and memory", gpu_cap.MEMORY_LIMIT: str(10 * 2**30)}
    assert gpu_cap.install(mig) and mig[gpu_cap.SHARING] == "mig"  # its own resource: never ambiguous
