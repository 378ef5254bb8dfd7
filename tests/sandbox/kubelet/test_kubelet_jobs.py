"""A test origin through the official client: an Indexed Job run by its kubelet (each container sees its
index and hostname as a real cluster gives them), and the Strict field validation project tests get."""

from __future__ import annotations

import json

import kubernetes
import pytest
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until

core, namespace = fixtures.core, fixtures.namespace


def test_indexed_job_containers_see_their_index_and_hostname(origin, core, namespace):
    client = origin.sandbox.api_client()
    batch = kubernetes.client.BatchV1Api(client)
    code = "import os; print(os.environ['JOB_COMPLETION_INDEX'], os.environ['HOSTNAME'])"
    batch.create_namespaced_job(namespace, {"metadata": {"name": "rank"}, "spec": {
        "completionMode": "Indexed", "completions": 3, "parallelism": 3, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "python:3.12",
                                                      "command": ["python3", "-c", code]}]}}}})
    wait_until(lambda: any(c.type == "Complete" for c in batch.read_namespaced_job_status(
        "rank", namespace).status.conditions or []), "the job to complete")
    pods = core.list_namespaced_pod(namespace, label_selector="job-name=rank").items
    lines = sorted(core.read_namespaced_pod_log(p.metadata.name, namespace, _preload_content=False).data.decode()
                   for p in pods)
    assert lines == ["0 rank-0\n", "1 rank-1\n", "2 rank-2\n"]
    assert batch.read_namespaced_job_status("rank", namespace).status.completed_indexes == "0-2"
    client.close()


def test_project_test_origins_refuse_unknown_fields(core, namespace):
    # the test origin's default is Strict, so a misspelt field in a manifest the project builds fails loudly
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "typo"}, "dta": {"k": "v"}})
    status = json.loads(err.value.body)
    assert (err.value.status, status["message"]) == (400, 'strict decoding error: unknown field "dta"')
