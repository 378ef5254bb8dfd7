"""The job controller through the official client: pods with the job labels, status following the pods,
backoffLimit, activeDeadlineSeconds, ttlSecondsAfterFinished."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client import ApiException


@pytest.fixture()
def batch(k8s):
    return kubernetes.client.BatchV1Api(k8s)


def _job(name, **spec):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "m", "image": "python:3.12"}]}}, **spec}}


def _pods(core, ns, job):
    return core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items


def _finish(core, ns, pod, phase):
    core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {"phase": phase}})


def _condition(batch, ns, name):
    conds = batch.read_namespaced_job_status(name, ns).status.conditions or []
    return [(c.type, c.reason) for c in conds]


def test_job_creates_a_labelled_owned_pod_and_completes_with_it(batch, core, ns, wait):
    job = batch.create_namespaced_job(ns, _job("train"))
    uid = job.metadata.uid
    [pod] = wait(lambda: _pods(core, ns, "train"), "the job's pod")
    labels = pod.metadata.labels
    assert labels["controller-uid"] == uid and labels["batch.kubernetes.io/controller-uid"] == uid
    assert labels["batch.kubernetes.io/job-name"] == "train" and pod.metadata.name.startswith("train-")
    assert pod.metadata.owner_references[0].uid == uid and pod.metadata.owner_references[0].controller
    wait(lambda: batch.read_namespaced_job_status("train", ns).status.active == 1, "active=1")
    _finish(core, ns, pod, "Succeeded")
    wait(lambda: ("Complete", "CompletionsReached") in _condition(batch, ns, "train"), "Complete")
    status = batch.read_namespaced_job_status("train", ns).status
    assert (status.succeeded, status.active, status.failed) == (1, 0, 0) and status.completion_time


def test_failed_pods_are_replaced_until_the_backoff_limit(batch, core, ns, wait):
    batch.create_namespaced_job(ns, _job("flaky", backoffLimit=1))
    [first] = wait(lambda: _pods(core, ns, "flaky"), "first pod")
    _finish(core, ns, first, "Failed")
    second = wait(lambda: [p for p in _pods(core, ns, "flaky") if p.metadata.name != first.metadata.name],
                  "a replacement pod")[0]
    _finish(core, ns, second, "Failed")
    wait(lambda: ("Failed", "BackoffLimitExceeded") in _condition(batch, ns, "flaky"), "Failed")
    assert batch.read_namespaced_job_status("flaky", ns).status.failed == 2
    assert len(_pods(core, ns, "flaky")) == 2  # no third attempt


def test_active_deadline_fails_the_job_and_stops_its_pods(batch, core, ns, wait):
    batch.create_namespaced_job(ns, _job("slow", activeDeadlineSeconds=1))
    wait(lambda: _pods(core, ns, "slow"), "the pod")
    wait(lambda: ("Failed", "DeadlineExceeded") in _condition(batch, ns, "slow"), "DeadlineExceeded")
    assert not [p for p in _pods(core, ns, "slow") if p.status.phase not in ("Succeeded", "Failed")]


def test_ttl_after_finished_deletes_the_job_and_its_pods(batch, core, ns, wait):
    batch.create_namespaced_job(ns, _job("brief", ttlSecondsAfterFinished=0))
    [pod] = wait(lambda: _pods(core, ns, "brief"), "the pod")
    _finish(core, ns, pod, "Succeeded")
    wait(lambda: not batch.list_namespaced_job(ns).items, "the job to be deleted")
    assert not _pods(core, ns, "brief")


def test_parallel_job_runs_several_pods_up_to_completions(batch, core, ns, wait):
    batch.create_namespaced_job(ns, _job("par", parallelism=2, completions=3))
    pods = wait(lambda: (lambda p: p if len(p) == 2 else None)(_pods(core, ns, "par")), "two pods")
    for p in pods:
        _finish(core, ns, p, "Succeeded")
    third = wait(lambda: [p for p in _pods(core, ns, "par") if p.status.phase == "Pending"], "the third pod")
    _finish(core, ns, third[0], "Succeeded")
    wait(lambda: ("Complete", "CompletionsReached") in _condition(batch, ns, "par"), "Complete")
    assert batch.read_namespaced_job_status("par", ns).status.succeeded == 3


def test_restart_policy_always_is_rejected(batch, ns):
    body = _job("bad")
    body["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(ns, body)
    cause = json.loads(err.value.body)["details"]["causes"][0]
    assert err.value.status == 422 and cause["field"] == "spec.template.spec.restartPolicy"


def test_indexed_job_gives_each_pod_its_index_hostname_and_env(batch, core, ns, wait):
    batch.create_namespaced_job(ns, _job("ranks", completionMode="Indexed", completions=3, parallelism=2))
    first = wait(lambda: len(p := _pods(core, ns, "ranks")) == 2 and p, "two pods (parallelism 2)")
    key = "batch.kubernetes.io/job-completion-index"
    assert sorted(p.metadata.annotations[key] for p in first) == ["0", "1"]
    for pod in first:
        index = pod.metadata.labels[key]
        assert pod.metadata.annotations[key] == index
        assert pod.metadata.name.startswith(f"ranks-{index}-") and pod.spec.hostname == f"ranks-{index}"
        env = {e.name: e.value_from.field_ref.field_path for e in pod.spec.containers[0].env}
        # as the job controller writes it: from the annotation (the label exists only from Kubernetes 1.28)
        assert env == {"JOB_COMPLETION_INDEX": f"metadata.annotations['{key}']"}
    by_index = {p.metadata.labels[key]: p for p in first}
    _finish(core, ns, by_index["1"], "Succeeded")
    _finish(core, ns, by_index["0"], "Failed")  # a failed index runs again in a new pod
    wait(lambda: batch.read_namespaced_job_status("ranks", ns).status.completed_indexes == "1", "index 1 done")
    later = wait(lambda: len(p := [p for p in _pods(core, ns, "ranks") if p.status.phase not in ("Succeeded", "Failed")
                                   ]) == 2 and p, "indexes 0 and 2 running")
    assert sorted(p.metadata.labels[key] for p in later) == ["0", "2"]
    for pod in later:
        _finish(core, ns, pod, "Succeeded")
    wait(lambda: ("Complete", "CompletionsReached") in _condition(batch, ns, "ranks"), "Complete")
    assert batch.read_namespaced_job_status("ranks", ns).status.completed_indexes == "0-2"


def test_indexed_job_needs_completions(batch, ns):
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(ns, _job("noidx", completionMode="Indexed", parallelism=2))
    assert err.value.status == 422
    assert json.loads(err.value.body)["details"]["causes"][0]["field"] == "spec.completions"


def test_work_queue_job_runs_parallelism_pods_and_completes_when_one_succeeds(batch, core, ns, wait):
    made = batch.create_namespaced_job(ns, _job("queue", parallelism=2))
    assert made.spec.completions is None and made.spec.parallelism == 2
    first, second = wait(lambda: len(p := _pods(core, ns, "queue")) == 2 and p, "two workers")
    _finish(core, ns, first, "Succeeded")
    wait(lambda: batch.read_namespaced_job_status("queue", ns).status.succeeded == 1, "one success")
    assert len(_pods(core, ns, "queue")) == 2  # no new worker after a success
    assert not _condition(batch, ns, "queue")  # the other worker is still running
    _finish(core, ns, second, "Succeeded")
    wait(lambda: ("Complete", "CompletionsReached") in _condition(batch, ns, "queue"), "Complete")
