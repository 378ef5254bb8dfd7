"""`python flow.py run` with a queued `@gpu_offload(gpus=0.5)` step, through Kueue, on the sandbox and (its Job,
admission and binding) on the real cluster with real Kueue 0.19: parts of a GPU queue like whole GPUs for a
Metaflow step too. The step's Job asks for the donor's shares (`nvidia.com/gpu.shared`, which
Metaflow's `gpu=` cannot name: `@kubernetes(extended_resources=...)`), waits suspended while another run holds
every share of the donor's GPU, is admitted to that donor's flavor once it ends, and runs holding two of the four
shares of one GPU, told its part as a runner is; the hub's meter charges it as half a GPU. A part the step's node
selector cannot hold to the donors that lend it in those units is refused before anything is deployed.

Donors: `whole` lends whole A100s (the cheapest), `sliced-a` and `sliced-b` time-slice each GPU in four shares, `halves`
in two, all under the renamed `nvidia.com/gpu.shared`: two of those is half a GPU on the sliced donors and a whole
GPU on `halves`, so a step that may land on any of them cannot be left to Kueue. On the real cluster the donors'
nodes have nothing behind them (no kubelet, as a virtual kubelet's): no other run holds the shares there (Kueue's
waitForPodsReady would evict it), and the real half stops once the real scheduler has bound the step's pod.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.usage import finished_run
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from ..realcluster.realorigin import RealCluster
from .conftest import (
    FlowRunner,
    S3Server,
    drop_sandbox_namespace,
    hub_user_namespace,
    queued_flows_origin,
    s3_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
NAMESPACE = "jhub-dora"
QUEUE = "gpu-offload"
SHARES = "nvidia.com/gpu.shared"
DONORS = (liqo.Donor("whole", 1, "A100", "0.50"),
          liqo.Donor("sliced-a", 1, "A100", "1.00", sharing="time-slicing", replicas=4),
          liqo.Donor("sliced-b", 1, "A100", "1.00", sharing="time-slicing", replicas=4),
          liqo.Donor("halves", 1, "A100", "2.00", sharing="time-slicing", replicas=2))
FLOW = '''
import os

from metaflow import FlowSpec, environment, gpu_offload, step

CREDENTIALS = {{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}}


class HalfFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @gpu_offload({arguments})
    @environment(vars=CREDENTIALS)
    @step
    def train(self):
        self.seen = {{k: os.environ.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "GPU_OFFLOAD_GPU_SHARING",
                                                   "GPU_OFFLOAD_GPU_ISOLATION", "GPU_OFFLOAD_GPU_FRACTION")}}
        self.next(self.end)

    @step
    def end(self):
        print("done", self.seen)


if __name__ == "__main__":
    HalfFlow()
'''


kueue_origin = queued_flows_origin(DONORS, real_nodes=0)  # on the real cluster, nothing behind the donors' nodes


@pytest.fixture(scope="module")
def s3(kueue_origin: Any) -> Iterator[S3Server]:
    yield from s3_of(kueue_origin)


@pytest.fixture(scope="module")
def user_namespace(kueue_origin: Any) -> Iterator[str]:
    """A hub user's namespace: offloaded to every donor, with its LocalQueue from `gpu-offload queues sync`."""
    yield hub_user_namespace(kueue_origin, NAMESPACE, [d.cluster_id for d in DONORS])
    drop_sandbox_namespace(kueue_origin, NAMESPACE)


def _flow(tmp_path: Path, arguments: str) -> None:
    (tmp_path / "half_flow.py").write_text(FLOW.format(arguments=arguments))


def _env(runner: FlowRunner, kueue_origin: Any, trusted: str) -> dict[str, str]:
    # what a hub's spawner sets in the user's server when queueing is on
    return runner.env({"KUBECONFIG": str(kueue_origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": NAMESPACE,
                       "JUPYTERHUB_USER": "dora", "GPU_OFFLOAD_QUEUE": QUEUE, "GPU_OFFLOAD_TRUSTED_CLUSTERS": trusted})


def _holder() -> dict[str, Any]:
    """Another run of the user's holding all four shares of sliced-a's GPU (admitted by Kueue, running)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "holder", "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"liqo.io/remote-cluster-id": "sliced-a"},
                     "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                      "effect": "NoExecute"}],
                     "containers": [{"name": "main", "image": "python:3.11-slim",
                                     "command": ["python3", "-c", "import time; time.sleep(600)"],
                                     "resources": {"limits": {SHARES: "4"}}}]}}


def _hold(core: Any, custom: Any) -> None:
    core.create_namespaced_pod(NAMESPACE, _holder())
    wait_until(lambda: [w for w in custom.list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")["items"]
                        if w["metadata"]["name"].startswith("pod-holder") and _condition(w, "Admitted")
                        .get("status") == "True"], "the other run admitted", timeout=120)


def _condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _step_workloads(custom: Any) -> list[dict[str, Any]]:
    return [w for w in custom.list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")["items"]
            if w["metadata"]["name"].startswith("job-")]


def test_a_queued_half_gpu_step_waits_for_its_shares_then_runs_holding_half_a_gpu_and_is_charged_half(
        kueue_origin: Any, user_namespace: str, s3: S3Server, tmp_path: Path) -> None:
    # trusted clusters only (the default): pinned to the one trusted donor, asked in its units
    _flow(tmp_path, "gpus=0.5")
    runner = FlowRunner(tmp_path, s3)
    with kueue_origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        batch = kubernetes.client.BatchV1Api(client)
        # on the real cluster no holder: nothing runs on the donors' nodes (no kubelet), and Kueue's waitForPodsReady
        # (45 s there) would evict it; the Job's ask, its admission to the right flavor and the pod's node are proven
        real = isinstance(kueue_origin.sandbox, RealCluster)
        if not real:
            _hold(core, custom)
        # a session of its own: `run` starts the step's `kubernetes step` process, which must go with it
        flow = subprocess.Popen([sys.executable, "half_flow.py", "run"], cwd=tmp_path,
                                env=_env(runner, kueue_origin, "sliced-a"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            (job,) = wait_until(lambda: batch.list_namespaced_job(NAMESPACE).items, "the step's Job", timeout=240)
            assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
            assert job.spec.suspend is True or real  # unheld on the real cluster, it may be admitted by now
            (container,) = job.spec.template.spec.containers
            # two of four shares, in the donor's units; no nvidia.com/gpu beside them
            assert container.resources.limits == {SHARES: "2"}
            assert container.resources.requests[SHARES] == "2"
            assert job.spec.template.spec.node_selector == {"liqo.io/type": "virtual-node",
                                                            "liqo.io/remote-cluster-id": "sliced-a"}
            if not real:
                wait_until(lambda: [w for w in _step_workloads(custom)
                                    if f"insufficient unused quota for {SHARES} in flavor"
                                    in _condition(w, "QuotaReserved").get("message", "")],
                           "the step's Workload waiting for the donor's shares", timeout=120)
                assert flow.poll() is None  # Metaflow waits for the suspended Job
                core.delete_namespaced_pod("holder", NAMESPACE, grace_period_seconds=0)
            (step_wl,) = wait_until(lambda: [w for w in _step_workloads(custom)
                                             if _condition(w, "Admitted").get("status") == "True"],
                                    "the step's Workload admitted", timeout=120)
            (assignment,) = step_wl["status"]["admission"]["podSetAssignments"]
            assert assignment["resourceUsage"][SHARES] == "2"
            flavor = custom.get_cluster_custom_object(*KUEUE, "resourceflavors", assignment["flavors"][SHARES])
            assert flavor["spec"]["nodeLabels"]["liqo.io/remote-cluster-id"] == "sliced-a"
            (pod,) = wait_until(lambda: [p for p in core.list_namespaced_pod(
                NAMESPACE, label_selector=f"job-name={job.metadata.name}").items if p.spec.node_name],
                "the step's pod scheduled", timeout=120)
            assert pod.spec.node_name == "sliced-a-gpu"
            if real:
                return
            out, _ = flow.communicate(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(flow.pid, signal.SIGKILL)  # the run and its step's process, whatever happened
            flow.wait()
        assert flow.returncode == 0, out[-3000:]
        (step_wl,) = _step_workloads(custom)
        assert _condition(step_wl, "Finished")["reason"] == "Succeeded"
        (pod,) = core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={job.metadata.name}").items
        # the hub's meter charges the step's pod by the part it held, from its resources and the donor's mode
        inventory = LiqoClient(client).read_inventory()
        nodes = {vn.name: vn for vn in inventory.virtual_nodes}
        run = finished_run(client.sanitize_for_serialization(pod), "MODIFIED",
                           {n: vn.cluster_id for n, vn in nodes.items()}, datetime.now(timezone.utc),
                           offers={n: vn.offer() for n, vn in nodes.items()})
        assert run is not None and (run.cluster_id, run.gpus, run.share) == ("sliced-a", 1, 0.5)
    probe = ("import json; from metaflow import Flow, namespace; namespace(None); "
             "print(json.dumps(Flow('HalfFlow').latest_run['train'].task.data.seen))")
    read = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=_env(runner, kueue_origin, "sliced-a"),
                          capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    # both shares of one GPU, as the device plugin names it; told its part as a runner is
    assert json.loads(read.stdout.strip().splitlines()[-1]) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-sliced-a-gpu-0", "GPU_OFFLOAD_GPU_SHARING": "time-slicing",
        "GPU_OFFLOAD_GPU_ISOLATION": "none", "GPU_OFFLOAD_GPU_FRACTION": "0.5"}


def test_a_queued_part_its_node_selector_cannot_hold_to_its_donors_is_refused_leaving_nothing(
        kueue_origin: Any, user_namespace: str, s3: S3Server, tmp_path: Path) -> None:
    _flow(tmp_path, "gpus=0.5, untrusted_ok=True")
    runner = FlowRunner(tmp_path, s3)
    with kueue_origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        batch = kubernetes.client.BatchV1Api(client)
        jobs = {j.metadata.name for j in batch.list_namespaced_job(NAMESPACE).items}
        pods = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
        workloads = {w["metadata"]["name"] for w in custom.list_namespaced_custom_object(
            *KUEUE, NAMESPACE, "workloads")["items"]}
        done = subprocess.run([sys.executable, "half_flow.py", "run"], cwd=tmp_path,
                              env=_env(runner, kueue_origin, "whole,sliced-a,sliced-b,halves"),
                              capture_output=True, text=True, timeout=240)
        assert done.returncode != 0
        said = " ".join((done.stdout + done.stderr).split())
        assert ("so Kueue picks the donor for 0.5 of a GPU (2 nvidia.com/gpu.shared): those units are that part of a "
                "GPU on sliced-a, sliced-b, while halves counts them too as another part") in said, said[-2000:]
        assert "@gpu_offload(cluster='sliced-a') or @gpu_offload(cluster='sliced-b')" in said
        # nothing new (what the previous test left may be going away meanwhile)
        assert {j.metadata.name for j in batch.list_namespaced_job(NAMESPACE).items} <= jobs
        assert {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items} <= pods
        assert {w["metadata"]["name"] for w in custom.list_namespaced_custom_object(
            *KUEUE, NAMESPACE, "workloads")["items"]} <= workloads
    assert not s3.keys(tmp_path.name)  # nothing uploaded either
