"""`python flow.py run --with gpu_offload:...` against the sandbox origin: the decorator attached from the
command line, not written on any step, sends every step as a Job to the chosen Liqo virtual node.
"""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes
import pytest

from .conftest import OFFLOADED, FlowRunner, jobs_and_pods

pytestmark = pytest.mark.slow

LIQO_TOLERATION_KEY = "virtual-node.liqo.io/not-allowed"
S3_SECRET = "cli-flow-s3"


def _create_s3_secret(origin) -> None:
    # The way a real cluster hands pods their object-store credentials; moto accepts any key.
    body = {
        "metadata": {"name": S3_SECRET},
        "stringData": {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"},
    }
    with origin.sandbox.api_client() as client:
        kubernetes.client.CoreV1Api(client).create_namespaced_secret(OFFLOADED, body)


def test_run_with_gpu_offload_on_the_command_line_runs_every_step_on_the_virtual_node(
    run_flow: FlowRunner, origin, cluster: dict[str, str]
) -> None:
    _create_s3_secret(origin)
    env = {**cluster, "METAFLOW_KUBERNETES_SECRETS": S3_SECRET}
    result = run_flow("cli_flow.py", "run", "--with", "gpu_offload:gpus=1,gpu_model=L4", env=env, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "total=45 in pod=True" in result.stdout + result.stderr

    jobs, pods = jobs_and_pods(origin, "gpu-offload.io/flow=CliFlow")
    assert sorted(j.metadata.labels["gpu-offload.io/step"] for j in jobs) == ["end", "start"]
    assert all(j.status.succeeded == 1 for j in jobs)
    assert sorted(p.metadata.labels["gpu-offload.io/step"] for p in pods) == ["end", "start"]
    for pod in pods:
        assert pod.spec.node_name == "donor-b-gpu"  # the only L4 donor's virtual node
        assert pod.status.phase == "Succeeded"
        assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
        assert LIQO_TOLERATION_KEY in {t.key for t in pod.spec.tolerations or []}
    (run_id,) = {p.metadata.labels["gpu-offload.io/run-id"] for p in pods}

    probe = (
        "import json; from metaflow import Run, namespace; namespace(None);"
        f"run = Run('CliFlow/{run_id}'); s = run['start'].task.data; e = run['end'].task.data;"
        "print(json.dumps({'ok': run.successful, 'total': e.total, 'start': s.start_in_pod,"
        " 'end': e.end_in_pod}))"
    )
    read = subprocess.run(
        [sys.executable, "-c", probe], cwd=run_flow.workdir, env=run_flow.env(cluster),
        capture_output=True, text=True, timeout=120,
    )
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout.strip().splitlines()[-1]) == {"ok": True, "total": 45, "start": True, "end": True}
