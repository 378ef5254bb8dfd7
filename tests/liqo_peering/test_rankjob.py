"""The distributed run's builders: literal Job and Service, validated against the real schemas."""

from __future__ import annotations

import json
import types

import kubernetes
import pytest
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.liqo_peering.placement import scheduling_fragment
from gpu_offload.liqo_peering.rankjob import (
    RankJobSpec,
    master_port,
    master_service,
    rank_job,
)
from gpu_offload.liqo_peering.specs import (
    RunnerPodSpec,
    label_value,
    runner_pod,
    runner_secret,
    runner_selector,
)

USER = label_value("alice@example.org")
LABELS = {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": USER,
          "gpu-offload.io/kernel": "k-42", "gpu-offload.io/run-id": "r1a2"}


def roundtrip(obj: dict, model: str) -> dict:
    """Through the official client's model and back: drops any field the client does not know."""
    client = kubernetes.client.ApiClient()
    typed = client.deserialize(types.SimpleNamespace(data=json.dumps(obj)), model)
    return client.sanitize_for_serialization(typed)


def pod_spec(**kw) -> RunnerPodSpec:
    base = dict(run_id="r1a2", namespace="alice", image="pytorch/pytorch:2.5", user="alice@example.org",
                kernel="k-42", scheduling=scheduling_fragment("donor-b", 4), timeout=600)
    base.update(kw)
    return RunnerPodSpec(**base)


def spec(nodes: int = 2, procs: int = 4, **kw) -> RankJobSpec:
    return RankJobSpec(pod_spec(**kw), nodes=nodes, procs_per_node=procs, master_port=23456)


def test_rank_job_is_an_indexed_all_or_nothing_job_of_runner_pods(k8s_schema) -> None:
    job = rank_job(spec())
    single = runner_pod(pod_spec())  # one cell's pod: the Job's pods are the same but for what follows
    template = job["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert job["metadata"] == {"name": "gpuo-r1a2", "namespace": "alice", "labels": LABELS,
                               "annotations": {"gpu-offload.io/user": "alice@example.org", "gpu-offload.io/kernel": "k-42"}}
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        "completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
        "activeDeadlineSeconds": 600}
    assert template["metadata"] == {"labels": LABELS, "annotations": single["metadata"]["annotations"]}
    assert container["env"][len(single["spec"]["containers"][0]["env"]):] == [
        {"name": "MASTER_ADDR", "value": "gpuo-r1a2-rank0"}, {"name": "MASTER_PORT", "value": "23456"},
        {"name": "PET_MASTER_ADDR", "value": "gpuo-r1a2-rank0"}, {"name": "PET_MASTER_PORT", "value": "23456"},
        {"name": "PET_NNODES", "value": "2"}, {"name": "PET_NPROC_PER_NODE", "value": "4"},
        {"name": "OMP_NUM_THREADS", "value": "1"},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    assert container["volumeMounts"][-1] == {"name": "dshm", "mountPath": "/dev/shm"}
    assert template["spec"]["volumes"][-1] == {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                            "sizeLimit": str(4 * 1024**3)}}
    # the rest of the pod is a single cell's: restricted security, the runner Secret, the same donor's affinity
    rest = {k: v for k, v in template["spec"].items() if k not in ("containers", "volumes")}
    assert rest == {k: v for k, v in single["spec"].items()
                    if k not in ("containers", "volumes", "activeDeadlineSeconds")}
    assert template["spec"]["volumes"][0] == single["spec"]["volumes"][0]
    assert template["spec"]["affinity"] == scheduling_fragment("donor-b", 4)["affinity"]
    k8s_schema(job)
    assert roundtrip(job, "V1Job") == job


def test_queued_job_is_one_unit_for_kueue_and_not_suspended_by_us(k8s_schema) -> None:
    job = rank_job(spec(queue="team-a", priority_class="high"))
    kueue = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}
    assert job["metadata"]["labels"] == {**LABELS, **kueue}
    # Kueue's Job webhook suspends a Job it manages (test_sandbox_rank_job); one Kueue does not manage runs
    assert "suspend" not in job["spec"]
    # on the pods Kueue's pod integration would gate each pod on its own, admitting part of the ranks
    assert not set(kueue) & set(job["spec"]["template"]["metadata"]["labels"])
    k8s_schema(job)
    assert "suspend" not in rank_job(spec())["spec"]


def test_the_run_may_set_its_own_thread_count_and_shm_size(k8s_schema) -> None:
    job = rank_job(RankJobSpec(pod_spec(env={"OMP_NUM_THREADS": "8"}, timeout=None), nodes=3, procs_per_node=1,
                               master_port=23456, shm_bytes=256 * 1024**2))
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "OMP_NUM_THREADS"] == ["8"]
    assert job["spec"]["template"]["spec"]["volumes"][-1]["emptyDir"]["sizeLimit"] == str(256 * 1024**2)
    assert "activeDeadlineSeconds" not in job["spec"]
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (3, 3)
    k8s_schema(job)


def test_master_service_is_headless_selects_pod_0_and_goes_with_the_job(k8s_schema) -> None:
    service = master_service(spec(), "job-uid-1")
    assert service == {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "gpuo-r1a2-rank0", "namespace": "alice", "labels": LABELS,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "gpuo-r1a2",
                                          "uid": "job-uid-1"}]},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/run-id": "r1a2",
                              "batch.kubernetes.io/job-completion-index": "0"},
                 "ports": [{"name": "rendezvous", "port": 23456, "targetPort": 23456, "protocol": "TCP"}]}}
    k8s_schema(service)
    assert roundtrip(service, "V1Service") == service
    # what the selector asks for, the Job's pods carry (the index label is the job controller's)
    assert set(service["spec"]["selector"].items()) - set(rank_job(spec())["spec"]["template"]["metadata"]
                                                          ["labels"].items()) == {
        ("batch.kubernetes.io/job-completion-index", "0")}


def test_the_runner_secret_is_owned_by_the_job_and_found_by_the_runs_selector(k8s_schema) -> None:
    job = rank_job(spec())
    secret = runner_secret(job, "job-uid-1", b"runner")
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "gpuo-r1a2", "uid": "job-uid-1"}]
    assert secret["metadata"]["name"] == job["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    pairs = dict(t.split("=", 1) for t in runner_selector(run_id="r1a2").split(","))
    for obj in (job, job["spec"]["template"], secret, master_service(spec(), "u")):
        assert pairs.items() <= obj["metadata"]["labels"].items()
    k8s_schema(secret)


def test_a_distributed_sessions_job_runs_session_launchers_reading_stdin_without_a_deadline(k8s_schema) -> None:
    job = rank_job(spec(session=True, timeout=None))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    # each pod's runner waits for its greeting and the cells on its stdin (attached to by the kernel)
    assert container["command"][-1] == "--session"
    assert (container["stdin"], container["stdinOnce"], container["tty"]) == (True, False, False)
    assert "activeDeadlineSeconds" not in job["spec"]  # a session lives until it is closed
    k8s_schema(job)


def test_master_port_is_per_run_and_unprivileged() -> None:
    ports = {master_port(f"run{i}") for i in range(50)}
    assert len(ports) > 40 and all(20000 <= p < 30000 for p in ports)
    assert master_port("run1") == master_port("run1")


@pytest.mark.parametrize("make, text", [
    (lambda: spec(nodes=0), "run r1a2: --nodes 0; ask for 1 or more pods"),
    (lambda: spec(procs=0), "0 processes per node"),
    (lambda: RankJobSpec(pod_spec(), 2, 1, master_port=80), "MASTER_PORT 80 is not an unprivileged port"),
    (lambda: RankJobSpec(pod_spec(), 2, 1, 23456, shm_bytes=0), "/dev/shm of 0 bytes"),
    (lambda: spec(run_id="Run_1"), "Job name \\(from run id\\) 'gpuo-Run_1' is not a DNS label"),
    (lambda: spec(priority_class="high"), "priority class 'high' but no queue"),
])
def test_bad_input_is_refused_naming_the_fix(make, text) -> None:
    with pytest.raises(InvalidRequest, match=text):
        rank_job(make())


def test_service_and_secret_need_the_created_jobs_uid() -> None:
    with pytest.raises(InvalidRequest, match="no job uid; create the Job first"):
        master_service(spec(), "")
    with pytest.raises(InvalidRequest, match="no job uid; create the job first"):
        runner_secret(rank_job(spec()), "", b"r")
