"""A user's GPU quota (a ResourceQuota in their namespace, as the hub's spawner sets it): a cell beyond it
is refused before anything runs, in words that say what holds the GPUs, and runs again once one is free."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError

from .conftest import leftovers
from .helpers import run_cell


def test_a_cell_beyond_the_gpu_quota_says_what_holds_it_and_leaves_nothing(kube: KubernetesBackend, core: Any,
                                                                          namespace: str) -> None:
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "gpu-offload"},
                                                      "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}})
    outcome, _, _ = run_cell(kube, "x = 1\nprint('warm')", {}, session="warm")
    assert outcome.status == "ok", outcome.error
    held = leftovers(core, namespace)
    with pytest.raises(OffloadUsageError) as err:
        run_cell(kube, "print('never')", {})
    message = str(err.value)
    assert "quota gpu-offload is used up" in message and "requests.nvidia.com/gpu=1" in message
    assert "Nothing was launched" in message and "%gpu_offload close NAME" in message
    assert leftovers(core, namespace) == held  # only the session's pod and Secret
    assert kube.close_session("warm", grace=0)
    outcome, sink, _ = run_cell(kube, "print('now there is room')", {})
    assert outcome.status == "ok" and "now there is room" in sink.text
