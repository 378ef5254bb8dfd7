"""Pods the project does not place stay on the origin, on the sandbox (whose Liqo webhook follows
``pkg/webhooks/pod/mutations.go`` of liqotech/liqo).

The attack: a user namespace is offloaded to every donor, as the hub's spawner does. A pod the project did not
place (a Metaflow step without ``@gpu_offload``, a Dask worker a notebook starts) asks for a GPU, which no origin
node has; if the namespace let Liqo's webhook add the virtual-node toleration to every pod, the scheduler would
send it to a donor, untrusted ones included, with the step's code, data and datastore credentials.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from .conftest import leftovers, offloaded_everywhere, settings
from .helpers import run_cell

__all__ = ["offloaded_everywhere"]


def step_pod(gpus: int) -> dict[str, Any]:
    """A pod shaped like a Metaflow ``@kubernetes`` step's (GPU limit, Metaflow's labels), without the
    placement ``@gpu_offload`` adds."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"step-{uuid.uuid4().hex[:6]}",
                         "labels": {"app.kubernetes.io/name": "metaflow-task", "metaflow/step_name": "train"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "python:3.11-slim", "resources": resources,
                                     "command": ["python3", "-c", "print('step ran')"]}]}}


def scheduled(core: Any, namespace: str, name: str) -> tuple[str, str] | None:
    """(node, "") once bound, ("", reason) once the scheduler said it cannot bind it, else None."""
    pod = core.read_namespaced_pod(name, namespace)
    if pod.spec.node_name:
        return pod.spec.node_name, ""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return "", condition.reason
    return None


@pytest.fixture()
def backend(api_client: Any, offloaded_everywhere: str, core: Any) -> Iterator[KubernetesBackend]:
    backend = KubernetesBackend(settings(offloaded_everywhere), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, offloaded_everywhere), "no pod or Secret left behind", timeout=60)


def test_a_step_pod_without_the_projects_placement_never_binds_to_a_virtual_node(core, offloaded_everywhere,
                                                                               backend) -> None:
    gpu_step, cpu_step = step_pod(1), step_pod(0)
    for pod in (gpu_step, cpu_step):
        core.create_namespaced_pod(offloaded_everywhere, pod)
    gpu = wait_until(lambda: scheduled(core, offloaded_everywhere, gpu_step["metadata"]["name"]),
                     "the GPU step pod judged by the scheduler", timeout=30)
    assert gpu == ("", "Unschedulable")  # no origin node has a GPU, and the donors' are not its to take
    cpu = wait_until(lambda: scheduled(core, offloaded_everywhere, cpu_step["metadata"]["name"]),
                     "the CPU step pod bound", timeout=30)
    assert cpu[0] in ("origin-core", "origin-user")
    # the project's own pod, in the same namespace, still reaches a donor with the placement it chose
    user_ns: dict[str, Any] = {"x": 2}
    outcome, _, run = run_cell(backend, "y = x * 21", user_ns)
    assert outcome.status == "ok", outcome.error
    assert user_ns["y"] == 42 and run.current.ctx.cluster in ("donor-1", "donor-2")
    assert scheduled(core, offloaded_everywhere, gpu_step["metadata"]["name"]) == ("", "Unschedulable")
    for pod in (gpu_step, cpu_step):
        core.delete_namespaced_pod(pod["metadata"]["name"], offloaded_everywhere, grace_period_seconds=0)
