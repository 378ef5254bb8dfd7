"""The runs extension's sources: with a namespace but no reachable cluster, the state directory still
answers and the reason the pods are missing is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_offload.liqo_peering.settings import read_kernel
from gpu_offload.magics.runs_api import RunsContext, sweep_period


def test_an_unreachable_cluster_leaves_the_state_dir_and_names_the_cause(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("GPU_OFFLOAD_NAMESPACE", "alice")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("GPU_OFFLOAD_STATE_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    ctx = RunsContext.from_environment()
    assert ctx.runs is None and ctx.book.root == tmp_path / "runs"
    assert "runner pods are not listed" in ctx.problem and "KUBECONFIG" in ctx.problem


def test_the_sweep_period_is_read_and_a_wrong_one_is_named_with_the_fix() -> None:
    def period_of(raw: str | None) -> tuple[float, str]:
        return sweep_period(read_kernel({} if raw is None else {"GPU_OFFLOAD_SWEEP_SECONDS": raw}))

    assert period_of(None) == (60.0, "") and period_of("0") == (0.0, "") and period_of("2.5") == (2.5, "")
    period, problem = period_of("soon")
    assert period == 60.0
    assert "GPU_OFFLOAD_SWEEP_SECONDS='soon' is not a number of seconds" in problem and "0 to turn" in problem
