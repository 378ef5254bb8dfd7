"""Distributed cells (``--nodes``) on the kubernetes backend through the sandbox, with the real engine: an
Indexed Job of 2 pods x 2 CPU ranks (torch gloo) all_reduces, every rank's output arrives, variables come back
from rank 0, a failing rank ends the run with its traceback, and no Job, pod, Service or Secret is left.
``--gpus 0`` ranks train with DDP from a real IPython shell as they would on a laptop, and Ctrl-C stops them
(distributed sessions: ``test_distributed_sessions.py``)."""

from __future__ import annotations

import re
import threading
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering.specs import runner_selector
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import RemoteError

from ..test_distributed import DDP_CELL, trained_in_one_process
from .helpers import Sink, run_cell

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
    from gpu_offload.engine.analysis import analyse_cell
    from gpu_offload.engine.backends.base import RunRequest
    from gpu_offload.engine.bundle import build_job

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


def test_cpu_ranks_on_two_pods_train_with_ddp_as_one_process_would_from_a_real_shell(
        shell: Any, api_client: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--gpus 0: the pods ask for no GPU; gloo on CPU gives the weights of one process on all the data."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=generator)
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=generator)
    initial = torch.nn.Linear(4, 1).state_dict()
    shell.user_ns.update(X=X, Y=Y, initial=initial, STEPS=20)

    shell.run_cell_magic("gpu_offload", f"--nodes 2 --procs-per-node 2 --gpus 0 --image {TORCH_IMAGE} --timeout 600",
                         DDP_CELL)

    out = capsys.readouterr().out
    assert sorted(line for line in out.splitlines() if line.startswith("[rank ")) == [
        f"[rank {r}] rank {r} of 4 trained" for r in range(4)]
    # the same steps on all the data in one process: DDP averages the gradients of the ranks' equal shards
    for name, value in trained_in_one_process(initial, X, Y, steps=20, lr=0.1).items():
        torch.testing.assert_close(shell.user_ns["weights"][name], value, rtol=1e-5, atol=1e-6)
    assert not torch.equal(shell.user_ns["weights"]["weight"], initial["weight"])  # it did train
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_ctrl_c_stops_every_cpu_rank_of_a_two_pod_cell_and_leaves_nothing(
        kube: KubernetesBackend, api_client: Any, core: Any, origin: Any, namespace: str) -> None:
    started: set[str] = set()
    pods: list[Any] = []

    def interrupt(text: str) -> None:
        started.update(re.findall(r"\[rank (\d)\] started", text))
        if len(started) == 4:  # every rank runs the cell: Ctrl-C now
            pods.extend(core.list_namespaced_pod(namespace, label_selector=runner_selector("alice@example.org")).items)
            raise KeyboardInterrupt

    user_ns: dict[str, Any] = {"x": "before"}
    cell = "import time\nx = 'after'\nprint('started', flush=True)\ntime.sleep(600)\n"
    with pytest.raises(KeyboardInterrupt):
        run_cell(kube, cell, user_ns, Sink(on_line=interrupt), image=TORCH_IMAGE, gpus=0, ranks=TWO_BY_TWO,
                 timeout=600)
    assert user_ns["x"] == "before"
    # both pods on one donor's virtual node, asking for no GPU, with the Liqo toleration the project wrote
    assert len(pods) == 2 and len({pod.spec.node_name for pod in pods}) == 1, pods
    for pod in pods:
        assert pod.spec.node_name.startswith("donor-")
        assert "nvidia.com/gpu" not in (pod.spec.containers[0].resources.limits or {})
        assert any(t.key == "virtual-node.liqo.io/not-allowed" for t in pod.spec.tolerations)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)
    wait_until(lambda: not origin.live_processes(), "every rank's process ended", timeout=120)


def test_cpu_ranks_under_kueue_and_a_single_cpu_cell_are_refused_before_anything_is_created(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    from gpu_offload.engine.errors import OffloadUsageError

    from .conftest import settings

    # a single cell still needs a GPU on this backend; only the ranks of a distributed cell may ask for none
    with pytest.raises(OffloadUsageError, match=r"--gpus 0: the kubernetes backend runs cells on donated GPUs"):
        run_cell(kube, "x = 1", {}, image=TORCH_IMAGE, gpus=0)
    queued = KubernetesBackend(settings(namespace, queue="gpus"), api_client)
    try:
        with pytest.raises(OffloadUsageError, match=r"--gpus 0 with --nodes: queueing through Kueue is on"):
            run_cell(queued, "x = 1", {}, image=TORCH_IMAGE, gpus=0, ranks=TWO_BY_TWO)
    finally:
        queued.close()
    assert everything_left(api_client, namespace) == []


def test_the_runs_pods_are_found_by_a_watch_that_rides_out_a_failing_api_server(
        kube: KubernetesBackend, api_client: Any, origin: Any, namespace: str) -> None:
    """The first two lists of the run's pods get a 500: the project's list/watch loop tries again after its
    backoff and the run goes on (a one-off list would have ended the run with the server's error)."""
    rule = origin.faults.api_error(rf"^/api/v1/namespaces/{namespace}/pods$", status=500, methods=("GET",), times=2)
    try:
        cell = "import os\nprint('here', flush=True)\nrank = int(os.environ['RANK'])\n"
        user_ns: dict[str, Any] = {}
        outcome, sink, _ = run_cell(kube, cell, user_ns, image=TORCH_IMAGE, gpus=0, ranks=TWO_BY_TWO, timeout=600)
        assert origin.faults.api.faults.fired(rule) == 2
    finally:
        origin.faults.clear()
    assert outcome.status == "ok", outcome.error
    assert sorted(sink.text.splitlines()) == [f"[rank {r}] here" for r in range(4)]
    assert user_ns["rank"] == 0
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)
