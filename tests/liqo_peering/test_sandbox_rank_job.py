"""A distributed run's Job, Secret and Service, sent with the official client: the ranks find each other.

The Job's pods run a stand-in for the runner (a zipapp in the bundle Secret, as the real one travels) that
does what a rank does first: ``init_process_group("gloo")`` from the environment the Job gives it, then one
``all_reduce``. Each pod is a process in its own network namespace; rank 1 reaches rank 0 through the
headless Service's short name, resolved by the pod's hosts file as DNS would.
"""

from __future__ import annotations

import io
import socket
import uuid
import zipfile
from pathlib import Path

import kubernetes
import pytest
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.placement import PlacementRequest, place
from gpu_offload.liqo_peering.rankjob import RankJobSpec, master_port, master_service, rank_job
from gpu_offload.liqo_peering.specs import RunnerPodSpec, runner_secret, runner_selector
from gpu_offload.sandbox.fixtures import pooled_as, wait_until
from gpu_offload.sandbox.kueue.pooled import kueue_origin_key
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.explain import FAILED, PodContext, pod_state

from ..origins import QUEUED

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
LIQO_CRDS = SHARED / "liqo-crds"
DONORS = (liqo.Donor("donor-1", 4, "A100", "2.00"),)
"""The queued origin's one donor; the unqueued tests run on the shared origin of tests/liqo_peering/conftest.py,
whose donor-1 is this donor beside a cheaper L4 donor: their ranks are placed on donor-1."""
KUEUE = ("kueue.x-k8s.io", "v1beta2")

RANK_MAIN = """import datetime, os, socket
import torch
import torch.distributed as dist
rank, world = int(os.environ["PET_NODE_RANK"]), int(os.environ["PET_NNODES"])
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
master = os.environ["MASTER_ADDR"]


def resolves(name):
    try:
        return socket.gethostbyname(name)
    except socket.gaierror as exc:  # -2 (EAI_NONAME): "no such name", at once, as a cluster's DNS says it
        return f"error{exc.errno}"


# the short name, then the origin's fully qualified name, then the one on the donor (Liqo's default mapping)
names = [master, f"{master}.NAMESPACE.svc.cluster.local", f"{master}.NAMESPACE-origin.svc.cluster.local"]
print(rank, world, *names[:1], *map(resolves, names), int(total.item()), flush=True)
dist.destroy_process_group()
"""


def zipapp(main: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("__main__.py", main)
    return buf.getvalue()


@pytest.fixture()
def offloaded(api_client):
    core = kubernetes.client.CoreV1Api(api_client)
    namespace = f"alice-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    yield namespace
    core.delete_namespace(namespace)


def launch(api_client, namespace: str, gpus: int, timeout: int | None = 600,
           queue: str | None = None) -> tuple[RankJobSpec, dict]:
    """Place, then create Job, Secret and Service in the order the backend will: as the Secret waits for its
    Job's uid, the pods wait for their Secret, and rank 1 may look up rank 0's name before it exists."""
    liqo_client = LiqoClient(api_client, request_timeout=30)
    where = place(liqo_client.read_inventory(), PlacementRequest(gpus, cluster=DONORS[0].cluster_id))
    liqo_client.ensure_offloading(namespace, [where.cluster_id])
    run_id = uuid.uuid4().hex[:10]
    spec = RankJobSpec(RunnerPodSpec(run_id=run_id, namespace=namespace, image="pytorch/pytorch:2.5",
                                     user="alice@example.org", kernel="kernel-1",
                                     scheduling=where.scheduling_fragment(), timeout=timeout, queue=queue),
                       nodes=2, procs_per_node=1, master_port=master_port(run_id))
    job = rank_job(spec)
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    created = batch.create_namespaced_job(namespace, job)
    main = RANK_MAIN.replace("NAMESPACE", namespace)
    core.create_namespaced_secret(namespace, runner_secret(job, created.metadata.uid, zipapp(main)))
    core.create_namespaced_service(namespace, master_service(spec, created.metadata.uid))
    return spec, job


def test_two_pods_all_reduce_over_gloo_finding_rank_0_by_the_services_short_name(api_client, offloaded) -> None:
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    spec, job = launch(api_client, offloaded, gpus=1)
    name = job["metadata"]["name"]
    wait_until(lambda: _condition(batch, offloaded, name), "the rank Job to finish", timeout=600, every=0.5)
    assert _condition(batch, offloaded, name) == "Complete"
    pods = {p.metadata.labels["batch.kubernetes.io/job-completion-index"]: p
            for p in core.list_namespaced_pod(offloaded, label_selector=runner_selector(run_id=spec.pod.run_id)).items}
    assert sorted(pods) == ["0", "1"]
    lines = {index: core.read_namespaced_pod_log(p.metadata.name, offloaded, _preload_content=False).data.decode()
             for index, p in pods.items()}
    # both ranks summed 1 + 2, and each reached rank 0 by the short name, which named pod 0's own address; the
    # pods run on a donor, in the namespace's twin there: the origin's fully qualified name does not resolve
    master, ip = f"gpuo-{spec.pod.run_id}-rank0", pods["0"].status.pod_ip
    assert lines == {index: f"{index} 2 {master} {ip} error{socket.EAI_NONAME} {ip} 3\n" for index in ("0", "1")}
    assert {p.spec.node_name for p in pods.values()} == {"donor-1-gpu"}
    assert pods["0"].status.pod_ip != pods["1"].status.pod_ip


def test_an_unschedulable_rank_is_visible_and_deleting_the_job_takes_pods_secret_and_service(api_client, offloaded):
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    # 3 GPUs per pod on a donor of 4: rank 0 starts (and waits at the rendezvous), rank 1 cannot be placed
    spec, job = launch(api_client, offloaded, gpus=3)
    selector = runner_selector(run_id=spec.pod.run_id)

    def stuck():
        pods = core.list_namespaced_pod(offloaded, label_selector=selector).items
        running = [p for p in pods if p.status.phase == "Running"]
        refused = [(p, c) for p in pods for c in p.status.conditions or []
                   if c.type == "PodScheduled" and c.status == "False"]
        return running and refused and (running[0], *refused[0])

    running, pending, condition = wait_until(stuck, "rank 0 running and rank 1 refused by the scheduler", timeout=300)
    assert (running.metadata.labels["batch.kubernetes.io/job-completion-index"],
            pending.metadata.labels["batch.kubernetes.io/job-completion-index"]) == ("0", "1")
    assert condition.reason == "Unschedulable" and "Insufficient nvidia.com/gpu" in condition.message
    # what the backend's follower reads for one cell's pod says the same of a rank's pod: the run can end now
    state = pod_state(api_client.sanitize_for_serialization(pending), PodContext("donor-1", 3, "pytorch/pytorch:2.5"))
    assert (state.kind, state.reason) == (FAILED, "Unschedulable") and condition.message in state.text
    events = core.list_namespaced_event(
        offloaded, field_selector=f"involvedObject.name={pending.metadata.name},reason=FailedScheduling").items
    assert events and events[0].message == condition.message and events[0].type == "Warning"

    name = job["metadata"]["name"]
    assert core.list_namespaced_secret(offloaded, label_selector=selector).items
    assert core.list_namespaced_service(offloaded, label_selector=selector).items
    batch.delete_namespaced_job(name, offloaded, propagation_policy="Background")

    def everything_gone():
        left = [*core.list_namespaced_pod(offloaded, label_selector=selector).items,
                *core.list_namespaced_secret(offloaded, label_selector=selector).items,
                *core.list_namespaced_service(offloaded, label_selector=selector).items]
        return not left

    wait_until(everything_gone, "pods, Secret and Service to go with the Job", timeout=120)


def _condition(batch, namespace: str, name: str) -> str | None:
    conditions = batch.read_namespaced_job_status(name, namespace).status.conditions or []
    return next((c.type for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)


QUEUED_HERE = QUEUED.with_donors(DONORS)
queued_origin = QUEUED_HERE.fixture(name="queued_origin")  # the session's Kueue origin of default options, DONORS


@pytest.fixture(scope="module")
@pooled_as(kueue_origin_key(**QUEUED_HERE.pool_options()))  # these tests go to that origin's xdist worker
def queued_client(queued_origin):
    """An origin with Kueue: a ClusterQueue of 3 GPUs on donor-1's flavor, for LocalQueues named ``q`` (deleted
    with the module's queue pool)."""
    with queued_origin.sandbox.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        custom.create_cluster_custom_object(*KUEUE, "resourceflavors", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "donor-1"},
            "spec": {"nodeLabels": {"liqo.io/remote-cluster-id": "donor-1"}}})
        custom.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "pool"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": "donor-1", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 3}]}]}]}})
        yield client


@pytest.fixture()
def queued_namespace(queued_client):
    core = kubernetes.client.CoreV1Api(queued_client)
    namespace = f"bob-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    kubernetes.client.CustomObjectsApi(queued_client).create_namespaced_custom_object(
        *KUEUE, namespace, "localqueues", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                           "metadata": {"name": "q"}, "spec": {"clusterQueue": "pool"}})
    yield namespace
    core.delete_namespace(namespace)


def test_kueue_admits_the_ranks_as_one_unit_or_none_of_them(queued_client, queued_namespace) -> None:
    batch, core = kubernetes.client.BatchV1Api(queued_client), kubernetes.client.CoreV1Api(queued_client)
    custom = kubernetes.client.CustomObjectsApi(queued_client)

    def workload(job: dict) -> dict | None:
        return next((w for w in custom.list_namespaced_custom_object(*KUEUE, queued_namespace, "workloads")["items"]
                     if any(r["name"] == job["metadata"]["name"] for r in w["metadata"].get("ownerReferences") or [])),
                    None)

    def pending(w: dict | None) -> bool:
        return w is not None and any(c["type"] == "QuotaReserved" and c["status"] == "False"
                                     for c in w.get("status", {}).get("conditions") or [])

    # 2 pods x 2 GPUs against a quota of 3: one pod would fit, but the Job is one Workload and waits whole
    big, big_job = launch(queued_client, queued_namespace, gpus=2, queue="q")
    held = wait_until(lambda: (w := workload(big_job)) and pending(w) and w, "Kueue to hold the 4-GPU Job")
    assert [(p["name"], p["count"]) for p in held["spec"]["podSets"]] == [("main", 2)]
    assert batch.read_namespaced_job(big_job["metadata"]["name"], queued_namespace).spec.suspend is True
    selector = runner_selector(run_id=big.pod.run_id)
    assert core.list_namespaced_pod(queued_namespace, label_selector=selector).items == []

    # 2 pods x 1 GPU fit: admitted together, unsuspended, and the ranks run to the end
    small, small_job = launch(queued_client, queued_namespace, gpus=1, queue="q")
    name = small_job["metadata"]["name"]
    wait_until(lambda: _condition(batch, queued_namespace, name), "the admitted rank Job to finish", timeout=600,
               every=0.5)
    assert _condition(batch, queued_namespace, name) == "Complete"
    pods = core.list_namespaced_pod(queued_namespace, label_selector=runner_selector(run_id=small.pod.run_id)).items
    assert sorted(p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert all(p.spec.node_selector == {"liqo.io/remote-cluster-id": "donor-1"} for p in pods)  # Kueue's flavor
    assert pending(workload(big_job))  # still whole, still waiting
