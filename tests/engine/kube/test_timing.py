"""A cell on the kubernetes backend (the sandbox's kubelet runs the real runner) times its pod's phases too:
placement, pod create, schedule and container start sit between the bundle and the runner's hello."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_offload.engine.timing import PHASES

KUBE_ONE_SHOT = ("analysis", "bundle", "placement", "pod create", "submitted", "schedule", "container start",
                 "runner start", "imports", "first line", "done")


def test_a_cluster_cell_times_its_pod_from_placement_to_first_line(shell: Any,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_cell_magic("gpu_offload", "--gpus 1 --timeout 120", "print('hello from the pod')")
    assert "hello from the pod" in capsys.readouterr().out
    timing = shell.magics_manager.registry["GpuOffloadMagics"].last_outcome.timing
    names = [name for name, _ in timing.marks]
    assert names == list(KUBE_ONE_SHOT)
    assert names == [p for p in PHASES if p in names]
    offsets = [at for _, at in timing.marks]
    assert offsets == sorted(offsets), timing.marks
    assert timing.runner_boot is not None and timing.runner_imports == 0.0
    shell.run_line_magic("gpu_offload", "status --timing")
    shown = capsys.readouterr().out
    assert all(f"  {name} " in shown for name in ("placement", "pod create", "schedule", "container start"))
