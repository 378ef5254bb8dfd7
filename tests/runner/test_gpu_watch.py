"""The runner stops a cell that holds more GPU memory than its part of a GPU, and says what to ask for."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_offload.runner import gpu_watch
from gpu_offload.runner.frames import Done, Error
from gpu_offload.runner.ticker import Ticker

from .fake_gpu import prelude

GIB = 2**30
SLICED_HALF = {"GPU_OFFLOAD_GPU_FRACTION": "0.5", "GPU_OFFLOAD_GPU_SHARING": "time-slicing",
               "GPU_OFFLOAD_GPU_ISOLATION": "none"}


def test_past_half_of_a_time_sliced_gpu_the_cell_is_stopped_with_the_part_and_the_fix():
    part = gpu_watch.limit_of(SLICED_HALF)
    assert part is not None
    text = gpu_watch.verdict(gpu_watch.Reading(45 * GIB, 80 * GIB), part)
    assert text == (
        "the cell was stopped: it held 45.0 GiB of GPU memory, more than its part (0.5 of a GPU, 40.0 GiB; "
        "time-slicing), and it would take memory the other cells on this GPU need (the donor shares it by "
        "time-slicing, which does not isolate memory). Ask for --gpu-memory 50Gi, or a whole GPU with --gpus 1; "
        "output so far is kept, no variable was copied back")
    assert gpu_watch.verdict(gpu_watch.Reading(40 * GIB, 80 * GIB), part) is None


def test_a_byte_limit_wins_over_the_fraction_and_a_need_past_the_gpu_asks_for_a_whole_one():
    part = gpu_watch.limit_of({"GPU_OFFLOAD_GPU_MEMORY_LIMIT": str(12 * GIB), "GPU_OFFLOAD_GPU_SHARING": "mps",
                               "GPU_OFFLOAD_GPU_ISOLATION": "compute and memory"})
    assert part is not None
    assert "more than its part (12.0 GiB; mps), and the donor keeps it to its part. Ask for --gpu-memory 15Gi" \
        in str(gpu_watch.verdict(gpu_watch.Reading(13 * GIB, None), part))
    assert "Ask for a whole GPU with --gpus 1;" in str(gpu_watch.verdict(gpu_watch.Reading(23 * GIB, 24 * GIB), part))


def test_whole_gpus_and_an_unknown_gpu_size_are_not_watched():
    assert gpu_watch.limit_of({}) is None
    assert gpu_watch.limit_of({"GPU_OFFLOAD_GPU_FRACTION": "1"}) is None
    assert gpu_watch.limit_of({"GPU_OFFLOAD_GPU_FRACTION": "junk"}) is None
    part = gpu_watch.limit_of(SLICED_HALF)
    assert part is not None and gpu_watch.verdict(gpu_watch.Reading(70 * GIB, None), part) is None


def test_the_largest_reading_of_the_sources_counts():
    sources = [lambda: gpu_watch.Reading(3 * GIB, 80 * GIB), lambda: None, lambda: 1 / 0,
               lambda: gpu_watch.Reading(5 * GIB)]
    saved = list(gpu_watch.SOURCES)
    gpu_watch.SOURCES[:] = sources
    try:
        assert gpu_watch.read() == gpu_watch.Reading(5 * GIB, 80 * GIB)
    finally:
        gpu_watch.SOURCES[:] = saved


def test_the_watch_stops_the_cell_once_and_says_why():
    held = [0]
    stopped = threading.Event()
    stops: list[int] = []
    saved = list(gpu_watch.SOURCES)
    gpu_watch.SOURCES[:] = [lambda: gpu_watch.Reading(held[0], 80 * GIB)]
    watch = gpu_watch.Watch(lambda: (stops.append(1), stopped.set()), SLICED_HALF)
    ticker = Ticker()
    try:
        ticker.start(0.05, [watch.task()])
        assert not stopped.wait(0.3) and watch.stopped is None
        held[0] = 41 * GIB
        assert stopped.wait(10)
        assert watch.stopped is not None and "held 41.0 GiB" in watch.stopped
        time.sleep(0.2)  # more ticks past the part: the cell is stopped once
        assert stops == [1]
    finally:
        ticker.stop()
        gpu_watch.SOURCES[:] = saved


@pytest.mark.e2e
def test_a_runner_over_its_half_of_a_gpu_stops_the_cell_and_reports_it(write_bundle, start_runner):
    cell = prelude(80) + "print('training')\ngpu_alloc(30)\ngpu_alloc(15)\nimport time\ntime.sleep(60)\nx = 1\n"
    path, bundle = write_bundle(cell, outputs=["x"], metrics_interval=0.1)
    runner = start_runner(path, bundle["nonce"], env={"PATH": "/usr/bin:/bin", **SLICED_HALF})
    events, code = runner.finish()
    errors = runner.of(Error)
    assert [e.ename for e in errors] == ["GpuMemoryExceeded"]
    assert "held 45.0 GiB of GPU memory, more than its part (0.5 of a GPU, 40.0 GiB; time-slicing)" \
        in errors[0].evalue
    assert "--gpu-memory 50Gi" in errors[0].evalue
    assert isinstance(events[-1], Done) and events[-1].status == "error" and code == 1
    assert runner.stdout() == "training\n"


@pytest.mark.e2e
def test_a_runner_within_its_part_or_holding_a_whole_gpu_is_left_alone(write_bundle, start_runner):
    # a runner holding whole GPUs does not even import the watch (the cell's prelude imports it after)
    cell = ("import sys\nprint(any(n.endswith('runner.gpu_watch') for n in sys.modules))\n" + prelude(80)
            + "gpu_alloc(39)\nimport time\ntime.sleep(0.5)\nprint('done')\n")
    for env in (SLICED_HALF, {}):
        path, bundle = write_bundle(cell if env else cell.replace("39", "70"), metrics_interval=0.05)
        runner = start_runner(path, bundle["nonce"], env={"PATH": "/usr/bin:/bin", **env})
        events, code = runner.finish()
        assert code == 0 and not runner.of(Error) and runner.stdout() == f"{bool(env)}\ndone\n"
