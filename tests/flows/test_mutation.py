"""The mutator on a real Metaflow flow class, including Metaflow's own re-run path.

On ``argo-workflows create`` Metaflow may run a step mutator a second time: it removes what the first
run inserted (``_remove_step_mutator_outputs``) but does not give back the ``@kubernetes`` that run
replaced. These tests drive exactly those Metaflow functions and check the step ends up the same.
"""

from __future__ import annotations

from typing import Any

import pytest
from metaflow import FlowSpec, environment, gpu_offload, kubernetes, step
from metaflow.decorators import _remove_step_mutator_outputs, _run_step_mutator


class TwiceFlow(FlowSpec):
    @gpu_offload(gpus=1, cluster="donor-a")
    @environment(vars={"WANDB_MODE": "offline"})
    @kubernetes(memory=9000, labels={"team": "ml"})
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE", "config")
    monkeypatch.setenv("GPU_OFFLOAD_TRUSTED_CLUSTERS", "donor-a")  # the steps below pin it
    monkeypatch.delenv("METAFLOW_GPU_OFFLOAD_PLACEMENT", raising=False)


def _step(cls: type, name: str) -> Any:
    return next(s for s in cls._steps if s.name == name)


def _attributes(step_function: Any) -> dict[str, dict[str, Any]]:
    return {d.name: dict(d.attributes) for d in step_function.decorators}


def test_running_the_mutator_twice_gives_the_same_step_with_the_users_arguments() -> None:
    start = _step(TwiceFlow, "start")
    mutator = start.config_decorators[0]
    _run_step_mutator(TwiceFlow, start, mutator, "%s %s")
    first = _attributes(start)
    _remove_step_mutator_outputs(start, mutator)  # what Metaflow does before re-running a mutator
    assert "kubernetes" not in _attributes(start)  # the user's @kubernetes is gone, as the design note says
    _run_step_mutator(TwiceFlow, start, mutator, "%s %s")
    second = _attributes(start)

    assert second == first
    k8s = second["kubernetes"]
    assert k8s["memory"] == 9000 and k8s["labels"]["team"] == "ml"
    assert k8s["gpu"] == 1
    assert k8s["node_selector"]["liqo.io/remote-cluster-id"] == "donor-a"
    assert second["environment"]["vars"]["WANDB_MODE"] == "offline"
    assert "METAFLOW_GPU_OFFLOAD_PLACEMENT" in second["environment"]["vars"]
    assert [d.name for d in start.decorators].count("kubernetes") == 1
