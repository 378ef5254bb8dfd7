"""Distributed cells (``--nodes``) on the kubernetes backend through the sandbox, with the real engine: an
Indexed Job of 2 pods x 2 CPU ranks (torch gloo) all_reduces, every rank's output arrives, variables come back
from rank 0, a failing rank ends the run with its traceback, and no Job, pod, Service or Secret is left (distributed
sessions: ``test_distributed_sessions.py``)."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes
from gpu_offload.liqo_peering.specs import runner_selector
from gpu_offload.magics.backends.base import Ranks
from gpu_offload.magics.backends.kube.backend import KubernetesBackend
from gpu_offload.magics.errors import RemoteError
from gpu_offload.sandbox.fixtures import wait_until

from .helpers import run_cell

TORCH_IMAGE = "pytorch/pytorch:2.5"
"""An image name the sandbox runs with torch installed (its ``*pytorch*`` mapping)."""
TWO_BY_TWO = Ranks(nodes=2, procs_per_node=2)
ALL_REDUCE = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank} of {world}: sum {int(total.item())}", flush=True)
result = (rank, int(total.item()) + base)
dist.destroy_process_group()
"""


def everything_left(api_client: Any, namespace: str) -> list[str]:
    """Jobs, pods, Services and Secrets of alice's runs that still exist."""
    selector = runner_selector("alice@example.org")
    core, batch = kubernetes.client.CoreV1Api(api_client), kubernetes.client.BatchV1Api(api_client)
    return ([f"job/{j.metadata.name}" for j in batch.list_namespaced_job(namespace, label_selector=selector).items]
            + [f"pod/{p.metadata.name}" for p in core.list_namespaced_pod(namespace, label_selector=selector).items]
            + [f"service/{s.metadata.name}"
               for s in core.list_namespaced_service(namespace, label_selector=selector).items]
            + [f"secret/{s.metadata.name}"
               for s in core.list_namespaced_secret(namespace, label_selector=selector).items])


def test_two_pods_of_two_ranks_all_reduce_and_rank_0s_variables_come_back(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    user_ns: dict[str, Any] = {"base": 100}
    outcome, sink, run = run_cell(kube, ALL_REDUCE, user_ns, image=TORCH_IMAGE, gpus=2, ranks=TWO_BY_TWO,
                                  timeout=600)
    assert outcome.status == "ok", outcome.error
    # 1 + 2 + 3 + 4 on every rank, each line prefixed with its rank
    assert sorted(sink.text.splitlines()) == [f"[rank {r}] rank {r} of 4: sum 10" for r in range(4)]
    assert user_ns["result"] == (0, 110)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_a_rank_that_raises_ends_the_run_with_its_traceback_and_leaves_nothing(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    user_ns: dict[str, Any] = {"result": "before"}
    cell = ("import os\nrank = int(os.environ['RANK'])\nif rank == 3:\n    raise ValueError('rank three broke')\n"
            "import time\nfor _ in range(600):\n    time.sleep(0.5)\nresult = 'after'\n")
    outcome, _, _ = run_cell(kube, cell, user_ns, image=TORCH_IMAGE, gpus=2, ranks=TWO_BY_TWO, timeout=600)
    assert isinstance(outcome.error, RemoteError), outcome
    assert outcome.error.ename == "ValueError"
    assert "rank three broke" in str(outcome.error) and "rank 3" in str(outcome.error)
    assert user_ns["result"] == "before"
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_a_restarted_kernel_removes_the_job_its_crashed_predecessor_left_running(
        api_client: Any, namespace: str) -> None:
    from gpu_offload.magics.analysis import analyse_cell
    from gpu_offload.magics.backends.base import RunRequest
    from gpu_offload.magics.bundle import build_job

    from .conftest import settings

    crashed = KubernetesBackend(settings(namespace, kernel="kernel-crash"), api_client)
    cell = "import time\ntime.sleep(600)"
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, crashed.transfer,
                       request=RunRequest(gpus=2, image=TORCH_IMAGE, ranks=TWO_BY_TWO, timeout=600))
    run = crashed.submit(job)
    wait_until(lambda: len([n for n in everything_left(api_client, namespace) if n.startswith("pod/")]) == 2,
               "both pods of the Job created", timeout=120)
    crashed.launcher.close()  # the kernel dies without releasing the run
    restarted = KubernetesBackend(settings(namespace, kernel="kernel-crash"), api_client)
    try:
        assert f"job/{run.job.name}" in [f"job/{name}" for name in restarted.cleaned]
        assert any(name.endswith("-rank0") for name in restarted.cleaned)  # the Service
        wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
                   timeout=120)
    finally:
        restarted.close()


def test_a_job_whose_second_pod_cannot_be_scheduled_ends_with_the_schedulers_reason(
        kube: KubernetesBackend, api_client: Any, core: Any, origin: Any, namespace: str) -> None:
    """Placement saw 4 free GPUs on donor-1 for 2 pods x 2; while the Job's create is held at the API server a
    neighbour takes 2 of them, so one pod starts (and waits at the rendezvous) and the other never fits."""
    rule = origin.faults.api_hold(rf"^/apis/batch/v1/namespaces/{namespace}/jobs$", methods=("POST",))
    neighbour = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "neighbour"},
                 "spec": {"nodeName": "donor-1-gpu", "containers": [{
                     "name": "c", "image": "python:3.11-slim", "command": ["python3", "-c", "import time; time.sleep(600)"],
                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                     "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                      "effect": "NoExecute"}]}}

    def take() -> None:
        try:
            wait_until(lambda: origin.faults.api.faults.fired(rule) >= 1, "the Job's create held")
            core.create_namespaced_pod(namespace, neighbour)
        finally:
            origin.faults.release(rule)

    thread = threading.Thread(target=take)
    thread.start()
    try:
        outcome, sink, _ = run_cell(kube, "print('never')", {}, image=TORCH_IMAGE, gpus=2, ranks=TWO_BY_TWO,
                                    cluster="donor-1", timeout=600)
        thread.join()
        assert isinstance(outcome.error, RemoteError), outcome
        assert not any("retrying" in n for n in sink.notices), sink.notices  # pinned: never moved
        assert outcome.error.ename == "Unschedulable", outcome.error
        assert "nvidia.com/gpu" in outcome.error.evalue
        wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
                   timeout=120)
    finally:
        thread.join()
        core.delete_namespaced_pod("neighbour", namespace, grace_period_seconds=0)
