"""`python flow.py run` with `@gpu_offload(gpus=0.5)` against a sandbox origin whose donors share GPUs: half a GPU is
one MPS share on donor-s (renamed `nvidia.com/gpu.shared`, two a GPU) or two of four time-sliced shares on donor-t
(under the plain `nvidia.com/gpu`); placement takes the MPS share, which leaves donor-s fuller and isolates the step's
memory. Metaflow's `gpu=` names `nvidia.com/gpu` only, so the share is asked through
`@kubernetes(extended_resources=...)`. The real Metaflow runtime creates the Job, the sandbox's device manager lends
the pod one MPS share of one GPU, the step is told its part as a runner is, and the artifacts come back through the
Metaflow client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox import objectstore
from gpu_offload.sandbox.fixtures import origin_fixture
from gpu_offload.sandbox.liqo import seed as liqo

from .conftest import BUCKET, FLOWS_MAP, LIQO_CRDS, FlowRunner, S3Server, jobs_and_pods

pytestmark = pytest.mark.slow

DONORS = (liqo.Donor("donor-t", 1, "A100", "1.00", sharing="time-slicing", replicas=4, renamed=False),
          liqo.Donor("donor-s", 1, "A100", "0.50", sharing="mps", replicas=2))
# the flows' origin (tests/flows/conftest.py), these two donors peered for the module
origin = origin_fixture(LIQO_CRDS, donors=DONORS, image_map=FLOWS_MAP)


@pytest.fixture(scope="module")
def s3_server(origin: Any) -> Iterator[S3Server]:
    with objectstore.s3_server(origin.host_address, [BUCKET]) as endpoint:
        yield S3Server(endpoint)


@pytest.fixture(scope="module")
def cluster(origin: Any) -> Iterator[dict[str, str]]:
    with origin.sandbox.api_client() as client:
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": "parts"}})
        kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
            "offloading.liqo.io", "v1beta1", "parts", "namespaceoffloadings",
            namespace_offloading("parts", [d.cluster_id for d in DONORS]))
    yield {"KUBECONFIG": str(origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": "parts",
           "GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-t,donor-s"}
    with origin.sandbox.api_client() as client:  # the origin is shared: the module's namespace goes with it
        kubernetes.client.CoreV1Api(client).delete_namespace("parts")


def test_a_half_gpu_step_runs_on_one_mps_share_asked_in_the_donors_units(run_flow: FlowRunner, origin: Any,
                                                                         cluster: dict[str, str]) -> None:
    result = run_flow("part_flow.py", "run", env=cluster, timeout=270)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs, pods = jobs_and_pods(origin, "gpu-offload.io/step=train", namespace="parts")
    assert len(jobs) == 1 and jobs[0].status.succeeded == 1
    (pod,) = pods
    assert pod.spec.node_name == "donor-s-gpu"
    (container,) = pod.spec.containers
    assert container.resources.limits == {"nvidia.com/gpu.shared": "1"}  # no nvidia.com/gpu beside it
    assert container.resources.requests["nvidia.com/gpu.shared"] == "1"
    probe = ("import json; from metaflow import Flow, namespace; namespace(None); run = Flow('PartFlow').latest_run;"
             "d = run['train'].task.data; print(json.dumps({'devices': d.devices, 'placement': d.placement,"
             " 'told': d.told}))")
    read = subprocess.run([sys.executable, "-c", probe], cwd=run_flow.workdir, env=run_flow.env(cluster),
                          capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    data = json.loads(read.stdout.strip().splitlines()[-1])
    assert data["devices"] == "GPU-donor-s-gpu-0"  # the one GPU its share is of, as the device plugin names it
    placement = json.loads(data["placement"])
    assert (placement["cluster_id"], placement["resources"], placement["share"]) == (
        "donor-s", [["nvidia.com/gpu.shared", 1]], 0.5)
    told = data["told"]
    assert told.pop("CUDA_MPS_PIPE_DIRECTORY")  # the device plugin's, under MPS only
    # the runner's variables: its mode, its isolation and its part of the GPU's memory (40 GiB of 80)
    assert told == {"GPU_OFFLOAD_GPU_SHARING": "mps", "GPU_OFFLOAD_GPU_ISOLATION": "compute and memory",
                    "GPU_OFFLOAD_GPU_MEMORY_LIMIT": str(40 * 2**30)}
