"""The runner follows the kernel: with no image configured a cell runs on the project's runner image for the
kernel's Python minor version, and a runner image declaring other versions is refused before anything is
created, naming the image to use."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from gpu_offload.liqo_peering.specs import runner_selector
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload import images
from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError

from .conftest import leftovers, settings
from .helpers import Sink, run_cell

KERNEL_MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"
OTHER_MINOR = "3.13" if KERNEL_MINOR != "3.13" else "3.11"


def _pod_image(core: Any, namespace: str, seen: dict[str, str]) -> Any:
    def grab(_: str) -> None:
        pods = core.list_namespaced_pod(namespace, label_selector=runner_selector("alice@example.org")).items
        if pods:
            seen.setdefault("image", pods[0].spec.containers[0].image)
    return grab


@pytest.mark.parametrize("registry", ["", "registry.example.org/ml"])
def test_a_cell_without_an_image_runs_on_the_runner_image_of_the_kernels_python(
        api_client: Any, core: Any, namespace: str, registry: str) -> None:
    backend = KubernetesBackend(settings(namespace, image=None, image_registry=registry), api_client)
    seen: dict[str, str] = {}
    try:
        outcome, _, _ = run_cell(backend, "print('on the default runner', flush=True)\ny = 2", {},
                                 Sink(on_line=_pod_image(core, namespace, seen)))
    finally:
        backend.close()
    assert outcome.status == "ok", outcome.error
    role = "runner-cuda" if images.kernel_versions().torch else "runner"
    expected = f"jupyter-gpu-offload/{role}:0.1.0-py{KERNEL_MINOR}"
    assert seen["image"] == (f"{registry}/{expected}" if registry else expected)
    wait_until(lambda: not leftovers(core, namespace), "pod and Secret deleted after the run")


def test_a_runner_image_of_another_python_is_refused_before_launch_naming_the_right_one(
        kube: KubernetesBackend, core: Any, namespace: str) -> None:
    wrong = f"registry.example.org/ml/jupyter-gpu-offload/runner:0.1.0-py{OTHER_MINOR}"
    with pytest.raises(OffloadUsageError) as err:
        run_cell(kube, "y = 1", {}, image=wrong)
    message = str(err.value)
    assert message.startswith("Nothing was launched") and wrong in message
    assert f"Python {OTHER_MINOR} (the kernel has {KERNEL_MINOR})" in message
    assert "jupyter-gpu-offload/runner" in message and f"py{KERNEL_MINOR}" in message  # the fix
    assert leftovers(core, namespace) == []


def test_a_distributed_cell_is_refused_the_same_way(kube: KubernetesBackend, core: Any, namespace: str) -> None:
    wrong = f"jupyter-gpu-offload/runner:0.1.0-py{OTHER_MINOR}"
    with pytest.raises(OffloadUsageError) as err:
        run_cell(kube, "y = 1", {}, image=wrong, ranks=Ranks(nodes=2, procs_per_node=1))
    assert f"Python {OTHER_MINOR}" in str(err.value)
    assert leftovers(core, namespace) == []
    assert not core.list_namespaced_pod(namespace).items
