"""`python flow.py run` with a @gpu_offload step against the sandbox origin: the real Metaflow runtime
creates the step's batch/v1 Job through the official client, the sandbox schedules its pod onto the chosen
Liqo virtual node and its test kubelet runs it as a local process (code package from moto S3), and the
artifacts come back through the Metaflow client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox import liqo
from gpu_offload.sandbox.fixtures import origin_fixture

from .conftest import FlowRunner

pytestmark = pytest.mark.slow

LIQO_CRDS = Path(__file__).resolve().parents[2] / ".." / "shared" / "liqo-crds"
DONORS = (liqo.Donor("donor-a", 4, "A100", "2.00"), liqo.Donor("donor-b", 8, "L4", "0.80"))
OFFLOADED = "gpu-jobs"
# Metaflow's default image (python:3.x) runs with this interpreter: it has what Metaflow's pod bootstrap
# installs (boto3, requests), so the bootstrap's pip finds them and needs no network.
origin = origin_fixture(LIQO_CRDS, donors=DONORS, image_map=(("python:*", sys.executable),))


@pytest.fixture(scope="module")
def cluster(origin) -> dict[str, str]:
    """Kubeconfig and namespace of the origin, ready for Metaflow's @kubernetes steps."""
    with origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        core.create_namespace({"metadata": {"name": OFFLOADED}})
        custom.create_namespaced_custom_object(
            "offloading.liqo.io", "v1beta1", OFFLOADED, "namespaceoffloadings",
            namespace_offloading(OFFLOADED, [d.cluster_id for d in DONORS]),
        )
        # Metaflow requests ephemeral-storage (its `disk`, 10240M by default) and the sandbox's virtual
        # nodes report none; a real Liqo virtual node reports the donor's. Give them some, as a donor would.
        for node in core.list_node(label_selector="liqo.io/type=virtual-node").items:
            status = {
                field: {**getattr(node.status, field), "ephemeral-storage": "100Gi"}
                for field in ("capacity", "allocatable")
            }
            core.patch_node_status(node.metadata.name, {"status": status})
    return {"KUBECONFIG": str(origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": OFFLOADED}


def test_offloaded_step_runs_as_a_job_on_the_chosen_virtual_node(
    run_flow: FlowRunner, origin, cluster: dict[str, str]
) -> None:
    result = run_flow("sandbox_flow.py", "run", env=cluster, timeout=270)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "total=45 in pod=True" in result.stdout + result.stderr

    with origin.sandbox.api_client() as client:
        jobs = kubernetes.client.BatchV1Api(client).list_namespaced_job(
            OFFLOADED, label_selector="gpu-offload.io/step=train"
        ).items
        pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod(
            OFFLOADED, label_selector="gpu-offload.io/step=train"
        ).items
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
