"""`python flow.py run` with a @gpu_offload step against the sandbox origin: the real Metaflow runtime
creates the step's batch/v1 Job through the official client, the sandbox schedules its pod onto the chosen
Liqo virtual node and its test kubelet runs it as a local process (code package from moto S3), and the
artifacts come back through the Metaflow client.
"""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.config import HubConfig
from gpu_offload.hub_extension.service.state import HubState
from gpu_offload.sandbox.fixtures import wait_until

from .conftest import OFFLOADED, FlowRunner, jobs_and_pods

pytestmark = pytest.mark.slow

def test_offloaded_step_runs_as_a_job_on_the_chosen_virtual_node(
    run_flow: FlowRunner, origin, cluster: dict[str, str], tmp_path
) -> None:
    result = run_flow("sandbox_flow.py", "run", env={**cluster, "JUPYTERHUB_USER": "dora"}, timeout=270)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "total=45 in pod=True" in result.stdout + result.stderr

    jobs, pods = jobs_and_pods(origin, "gpu-offload.io/step=train")
    assert len(jobs) == 1 and jobs[0].status.succeeded == 1
    (pod,) = pods
    assert pod.spec.node_name == "donor-a-gpu"  # the only A100 donor's virtual node
    assert pod.status.phase == "Succeeded"
    assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert pod.metadata.labels["gpu-offload.io/flow"] == "SandboxFlow"
    run_id = pod.metadata.labels["gpu-offload.io/run-id"]

    probe = (
        "import json; from metaflow import Run, namespace; namespace(None);"
        f"run = Run('SandboxFlow/{run_id}'); d = run['train'].task.data;"
        "print(json.dumps({'ok': run.successful, 'total': d.total, 'pod': d.ran_in_pod, 'placement': d.placement}))"
    )
    read = subprocess.run(
        [sys.executable, "-c", probe], cwd=run_flow.workdir, env=run_flow.env(cluster),
        capture_output=True, text=True, timeout=120,
    )
    assert read.returncode == 0, read.stderr
    data = json.loads(read.stdout.strip().splitlines()[-1])
    assert data["ok"] is True and data["total"] == 45 and data["pod"] is True
    assert json.loads(data["placement"])["cluster_id"] == "donor-a"

    # the hub's usage meter finds the step's pod and charges its GPU time to the hub user who ran the flow
    with origin.sandbox.api_client() as client:
        state = HubState(HubConfig(), client, Store(f"sqlite:///{tmp_path}/usage.sqlite")).start()
        try:
            assert state.wait_synced(60)
            wait_until(lambda: state.store.totals("dora"), "the step's GPU time recorded")
            (run,) = state.store.runs("dora")
            assert (run.pod, run.cluster_id, run.gpus, run.phase) == (pod.metadata.name, "donor-a", 1, "Succeeded")
        finally:
            state.close()


def test_bad_input_on_run_launches_nothing(run_flow: FlowRunner, origin, cluster: dict[str, str]) -> None:
    def objects() -> tuple[int, int]:
        with origin.sandbox.api_client() as client:
            jobs = kubernetes.client.BatchV1Api(client).list_namespaced_job(OFFLOADED).items
            pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod(OFFLOADED).items
        return len(jobs), len(pods)

    before = objects()
    result = run_flow("bad_flow.py", "run", env={**cluster, "BAD_CASE": "conflict-gpu"})
    assert result.returncode != 0
    assert "@kubernetes(gpu=2) conflicts with @gpu_offload(gpus=1)" in result.stderr
    assert "Workflow starting" not in result.stdout + result.stderr  # not even the local start step ran
    assert objects() == before
