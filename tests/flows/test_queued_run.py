"""`python flow.py run` with a queued @gpu_offload step, through Kueue, on both clusters: the sandbox with its Kueue
and the real cluster with real Kueue 0.19 (tests/realcluster; the step runs in a real container on the real
node donor-1-gpu, in the project's user-server image, which has the boto3 and pip Metaflow's pod bootstrap
needs: tests/realcluster/singleuser_image.sh). The step's Job carries
the queue and priority labels, Kueue's Job integration creates it suspended while another run holds the
pool, and once that run ends Kueue admits it, unsuspends it, and the step completes. Without a queue setting
the flow finds the namespace's one LocalQueue as a kernel does; several stop it before anything is deployed.

Kueue alone picks the donor: the other run holds every GPU of the only donor when the flow is deployed, so a
placement that looked for a free GPU first would refuse the step; the Job names no donor, and the donor's
node labels on its pods are the ones Kueue added from the flavor it admitted the Job to.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from ..realcluster.realorigin import REAL_NODES, RealCluster
from .conftest import (
    DATA,
    TRUSTING,
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
# The only donor, with the model the flow's step names; on the real cluster its node is the real kubelet's
# donor-1-gpu (realorigin: the first donor's node is the first real node)
DONOR = liqo.Donor("donor-1", 2, "A100", "2.00")
STEP_IMAGE = "localhost/jupyter-gpu-offload/singleuser:0.1.0"
"""The step pods' image on the real cluster (the sandbox runs them with this machine's interpreter)."""


# the step's pod runs on the real node on the real cluster
kueue_origin = queued_flows_origin((DONOR,))


@pytest.fixture(scope="module")
def step_image(kueue_origin: Any) -> dict[str, str]:
    """Metaflow's settings for the step pods' image: none on the sandbox (Metaflow's default, mapped to this
    machine's interpreter); on the real cluster the user-server image, which must be on the real node."""
    if not isinstance(kueue_origin.sandbox, RealCluster):
        return {}
    with kueue_origin.sandbox.api_client() as client:
        images = kubernetes.client.CoreV1Api(client).read_node(REAL_NODES[0]).status.images or []
    if not any(STEP_IMAGE in (image.names or []) for image in images):
        pytest.skip(f"{STEP_IMAGE} is not on {REAL_NODES[0]}: run tests/realcluster/singleuser_image.sh first")
    return {"METAFLOW_KUBERNETES_CONTAINER_IMAGE": STEP_IMAGE}


@pytest.fixture(scope="module")
def s3(kueue_origin: Any) -> Iterator[S3Server]:
    yield from s3_of(kueue_origin)


@pytest.fixture(scope="module")
def user_namespace(kueue_origin: Any) -> Iterator[str]:
    """A hub user's namespace: offloaded, with its LocalQueue from `gpu-offload queues sync`."""
    yield hub_user_namespace(kueue_origin, NAMESPACE, [DONOR.cluster_id])
    drop_sandbox_namespace(kueue_origin, NAMESPACE)


def _holder() -> dict[str, Any]:
    """Another run of the user's holding both GPUs of the pool (admitted by Kueue, running)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "holder", "labels": {"kueue.x-k8s.io/queue-name": QUEUE,
                                                      "kueue.x-k8s.io/priority-class": "interactive"}},
            "spec": {"restartPolicy": "Never",
                     "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                      "effect": "NoExecute"}],
                     "containers": [{"name": "main", "image": "python:3.11-slim",
                                     "command": ["python3", "-c", "import time; time.sleep(600)"],
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def _workloads(custom: Any) -> list[dict[str, Any]]:
    return list(custom.list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")["items"])


LOST_FOR_20_SECONDS = {("node.kubernetes.io/not-ready", "NoExecute", 20), ("node.kubernetes.io/unreachable", "NoExecute", 20)}


def _node_lost(tolerations: Any) -> set[tuple[str, str, int]]:
    """The step pod's tolerations of a lost node: (taint, effect, seconds)."""
    return {(t.key, t.effect, t.toleration_seconds) for t in tolerations or [] if t.key in (
        "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")}


def _condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def test_a_queued_run_step_waits_suspended_in_the_queue_then_completes(
        kueue_origin: Any, user_namespace: str, s3: S3Server, step_image: dict[str, str], tmp_path: Path) -> None:
    with kueue_origin.sandbox.api_client() as client:
        _queued_run(kueue_origin, client, user_namespace, s3, step_image, tmp_path)


def _queued_run(kueue_origin: Any, client: Any, user_namespace: str, s3: S3Server, step_image: dict[str, str],
                tmp_path: Path) -> None:
    core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
    batch = kubernetes.client.BatchV1Api(client)
    core.create_namespaced_pod(user_namespace, _holder())
    wait_until(lambda: core.read_namespaced_pod("holder", user_namespace).status.phase == "Running",
               "the other run admitted and running", timeout=120)

    runner = FlowRunner(tmp_path, s3)
    (tmp_path / "queued_flow.py").write_text((DATA / "queued_flow.py").read_text())
    env = runner.env({"KUBECONFIG": str(kueue_origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": NAMESPACE,
                      "JUPYTERHUB_USER": "dora", **TRUSTING, **step_image,
                      # what a hub's spawner sets in the user's server when queueing is on
                      "GPU_OFFLOAD_QUEUE": QUEUE, "GPU_OFFLOAD_PRIORITY": "interactive",
                      # and the kernel's toleration of a lost node, which the step's pod follows too
                      "GPU_OFFLOAD_NODE_LOST_SECONDS": "20"})
    flow = subprocess.Popen([sys.executable, "queued_flow.py", "run"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        jobs = wait_until(lambda: batch.list_namespaced_job(user_namespace).items, "the step's Job", timeout=240)
        (job,) = jobs
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
        assert job.metadata.labels["kueue.x-k8s.io/priority-class"] == "batch"
        assert job.spec.suspend is True  # Kueue's Job webhook: created suspended
        assert _node_lost(job.spec.template.spec.tolerations) == LOST_FOR_20_SECONDS
        # no donor picked before the queue: only the virtual-node type and the model the step asked for
        assert job.spec.template.spec.node_selector == {"liqo.io/type": "virtual-node",
                                                        "gpu-offload.io/gpu-model": "A100"}
        # what the hub's queue page shows a user: the QuotaReserved message (reason "Pending": Kueue 0.19.2's, the
        # granular "WaitingForQuota" comes only with its UnadmittedWorkloadsObservability gate, off by default)
        pending = wait_until(lambda: [w for w in _workloads(custom) if w["metadata"]["name"].startswith("job-")
                                      and _condition(w, "QuotaReserved").get("status") == "False"
                                      and _condition(w, "QuotaReserved").get("reason") == "Pending"
                                      and "insufficient unused quota for nvidia.com/gpu in flavor gpuo-donor-1-a100"
                                      in _condition(w, "QuotaReserved").get("message", "")],
                             "the step's Workload waiting for quota", timeout=120)
        assert pending[0]["spec"]["priority"] == 100  # batch, below the holder's interactive: no preemption
        assert not core.list_namespaced_pod(user_namespace, label_selector=f"job-name={job.metadata.name}").items
        assert flow.poll() is None  # Metaflow waits for the suspended Job

        core.delete_namespaced_pod("holder", user_namespace, grace_period_seconds=0)
        out, _ = flow.communicate(timeout=300)
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)  # the run and its step's `kubernetes step` child, which polls the Job
            flow.wait()
    assert flow.returncode == 0, out[-3000:]
    assert "total=45 after the queue" in out
    (step_wl,) = [w for w in _workloads(custom) if w["metadata"]["name"].startswith("job-")]
    assert _condition(step_wl, "Admitted")["status"] == "True"
    assert _condition(step_wl, "Finished")["reason"] == "Succeeded"
    done = batch.read_namespaced_job(job.metadata.name, user_namespace)
    assert done.spec.suspend is False and done.status.succeeded == 1
    # admitted onto the flavor of the donor: Kueue added the flavor's node labels to the Job's pods
    flavor = custom.get_cluster_custom_object(*KUEUE, "resourceflavors", step_wl["status"]["admission"]
                                              ["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"])
    assert flavor["spec"]["nodeLabels"]["liqo.io/remote-cluster-id"] == DONOR.cluster_id
    for selector in [done.spec.template.spec.node_selector,
                     *(p.spec.node_selector for p in core.list_namespaced_pod(
                         user_namespace, label_selector=f"job-name={job.metadata.name}").items)]:
        assert selector == {"liqo.io/type": "virtual-node", **flavor["spec"]["nodeLabels"]}
    # it ran on the donor's node, which carries the model the step asked for
    (pod,) = core.list_namespaced_pod(user_namespace, label_selector=f"job-name={job.metadata.name}").items
    assert pod.spec.node_name == DONOR.node_name
    # the pod kept the short toleration of a lost node (the API server adds its 300 s only where none is given)
    assert _node_lost(pod.spec.tolerations) == LOST_FOR_20_SECONDS
    assert core.read_node(pod.spec.node_name).metadata.labels["gpu-offload.io/gpu-model"] == "A100"
    # in the project's ClusterQueue, through the user's LocalQueue
    assert step_wl["spec"]["queueName"] == QUEUE
    assert step_wl["status"]["admission"]["clusterQueue"] == "gpu-offload"


def test_without_a_queue_setting_the_step_waits_in_the_one_localqueue_of_its_namespace(
        kueue_origin: Any, user_namespace: str, s3: S3Server, step_image: dict[str, str], tmp_path: Path) -> None:
    with kueue_origin.sandbox.api_client() as client:
        batch = kubernetes.client.BatchV1Api(client)
        before = {j.metadata.name for j in batch.list_namespaced_job(user_namespace).items}
        runner = FlowRunner(tmp_path, s3)
        # no GPU_OFFLOAD_QUEUE nor METAFLOW_GPU_OFFLOAD_QUEUE: the flow lists the namespace's LocalQueues, as a
        # kernel does, and finds the one `gpu-offload queues sync` made
        done = runner("queued_flow.py", "run", timeout=300, env={
            "KUBECONFIG": str(kueue_origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": user_namespace,
            "JUPYTERHUB_USER": "dora", **step_image})
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        (job,) = [j for j in batch.list_namespaced_job(user_namespace).items if j.metadata.name not in before]
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
    assert job.metadata.labels["kueue.x-k8s.io/priority-class"] == "batch"
    assert job.status.succeeded == 1
    assert "total=45 after the queue" in done.stdout + done.stderr


def test_several_localqueues_and_no_queue_setting_stop_the_flow_before_anything_is_deployed(
        kueue_origin: Any, s3: S3Server, tmp_path: Path) -> None:
    namespace = "jhub-erin"
    with kueue_origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        batch = kubernetes.client.BatchV1Api(client)
        core.create_namespace({"metadata": {"name": namespace, "labels": {"gpu-offload.io/user-namespace": "true"}}})
        custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings",
                                               namespace_offloading(namespace, [DONOR.cluster_id]))
        for name in ("gpu-offload", "night"):
            custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", {
                "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": name},
                "spec": {"clusterQueue": "gpu-offload"}})
        done = FlowRunner(tmp_path, s3)("queued_flow.py", "run", env={
            "KUBECONFIG": str(kueue_origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": namespace})
        assert done.returncode != 0
        said = " ".join((done.stdout + done.stderr).split())
        assert (f"neither METAFLOW_GPU_OFFLOAD_QUEUE nor GPU_OFFLOAD_QUEUE is set and namespace {namespace} has 2 "
                "Kueue LocalQueues (gpu-offload, night), so the flow cannot tell which one its @gpu_offload steps "
                "should wait in; name one, e.g. `export METAFLOW_GPU_OFFLOAD_QUEUE=gpu-offload`") in said, said[-2000:]
        assert not batch.list_namespaced_job(namespace).items
        assert not core.list_namespaced_pod(namespace).items


def _notices(out: list[str], words: str) -> list[str]:
    return [line for line in "".join(out).splitlines() if words in line]


def test_a_queued_step_preempted_by_a_higher_priority_run_is_told_then_reruns_and_the_flow_finishes(
        kueue_origin: Any, user_namespace: str, s3: S3Server, step_image: dict[str, str], tmp_path: Path) -> None:
    """Kueue preempts the running `batch` step for an `interactive` run: Metaflow waits on without a word, the
    project's watch of the run's Jobs says it (in the step's lines, with Kueue's reason and the place in line),
    says when Kueue admits it again, the step reruns from its start and the flow finishes; nothing stays."""
    with kueue_origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        batch = kubernetes.client.BatchV1Api(client)
        before = {j.metadata.name for j in batch.list_namespaced_job(user_namespace).items}
        runner = FlowRunner(tmp_path, s3)
        (tmp_path / "preempted_flow.py").write_text((DATA / "preempted_flow.py").read_text())
        env = runner.env({"KUBECONFIG": str(kueue_origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": NAMESPACE,
                          "JUPYTERHUB_USER": "dora", **TRUSTING, **step_image, "GPU_OFFLOAD_QUEUE": QUEUE})
        flow = subprocess.Popen([sys.executable, "preempted_flow.py", "run"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(iter(flow.stdout.readline, "")), daemon=True)
        reader.start()
        try:
            (job,) = wait_until(lambda: [j for j in batch.list_namespaced_job(user_namespace).items
                                         if j.metadata.name not in before], "the step's Job", timeout=240)
            name, selector = job.metadata.name, f"job-name={job.metadata.name}"
            (first,) = wait_until(lambda: [p for p in core.list_namespaced_pod(
                user_namespace, label_selector=selector).items if p.status.phase == "Running"],
                "the step's pod running", timeout=240)
            core.create_namespaced_pod(user_namespace, _holder())  # interactive, the pool's two GPUs
            wait_until(lambda: batch.read_namespaced_job(name, user_namespace).spec.suspend,
                       "Kueue preempting the step (its Job suspended)", timeout=120)
            try:
                (said,) = wait_until(lambda: _notices(out, "was preempted"), "the run saying the step was preempted",
                                     timeout=60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the run printed:\n{''.join(out)[-3000:]}") from None
            assert flow.poll() is None  # Metaflow itself still waits
            # Kueue admits the higher-priority run, not the step back: the step waits behind it
            wait_until(lambda: core.read_namespaced_pod("holder", user_namespace).status.phase == "Running",
                       "the higher-priority run running", timeout=120)
            assert batch.read_namespaced_job(name, user_namespace).spec.suspend, [
                (w["metadata"]["name"], w["status"].get("conditions")) for w in _workloads(custom)]
            assert not _notices(out, "admitted by Kueue again")
            core.delete_namespaced_pod("holder", user_namespace, grace_period_seconds=0)
            flow.wait(timeout=400)
            reader.join(10)
        finally:
            if flow.poll() is None:
                os.killpg(flow.pid, signal.SIGKILL)
                flow.wait()
            with contextlib.suppress(kubernetes.client.ApiException):
                core.delete_namespaced_pod("holder", user_namespace, grace_period_seconds=0)
        text = "".join(out)
        assert flow.returncode == 0, text[-3000:]
        # said in the step's lines (Metaflow's `[run/step/task]` head), in words, with what happens next
        assert re.search(r"\[\d+/train/\d+\] gpu-offload: step train \(task \d+, attempt 0\) was preempted by a "
                         r"higher-priority run after \d+ s\. Its pod is gone and what it had done is lost; it waits in "
                         r"Kueue's queue again; (1st of 1|2nd of 2) in LocalQueue gpu-offload and will rerun from its start "
                         r"once admitted", said), said
        assert len(_notices(out, "was preempted")) == 1
        (again,) = _notices(out, "admitted by Kueue again after")
        assert "gpu-offload: step train (task" in again and again.endswith("in line; it reruns from its start")
        assert text.index("was preempted") < text.index("admitted by Kueue again")
        # rerun from its start in a new pod (Metaflow shows the step's lines from its log in the object store,
        # which the deleted first pod may not have written), then the flow finished
        assert "total=45 after the rerun" in text
        # nothing left: the Job finished, its Workload too, no pod of it but the one that succeeded, no holder,
        # and no process of the run (its `kubernetes step` child included)
        done = batch.read_namespaced_job(name, user_namespace)
        assert done.status.succeeded == 1 and not done.spec.suspend
        (workload,) = [w for w in _workloads(custom) if any(o["uid"] == done.metadata.uid
                                                            for o in w["metadata"].get("ownerReferences") or [])]
        assert _condition(workload, "Finished")["reason"] == "Succeeded"
        (last,) = wait_until(lambda: [p for p in core.list_namespaced_pod(user_namespace, label_selector=selector).items
                                      if p.status.phase == "Succeeded"] or None, "the step's finished pod", timeout=60)
        assert last.metadata.name != first.metadata.name
        wait_until(lambda: all(p.status.phase == "Succeeded" for p in core.list_namespaced_pod(
            user_namespace, label_selector=selector).items), "only the step's finished pod left", timeout=60)
        wait_until(lambda: not [p for p in core.list_namespaced_pod(user_namespace).items
                                if p.metadata.name == "holder"], "the holder gone", timeout=60)
        with pytest.raises(ProcessLookupError):
            os.killpg(flow.pid, 0)
