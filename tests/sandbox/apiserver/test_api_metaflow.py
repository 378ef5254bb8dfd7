"""Metaflow's own Kubernetes plugin (its job builder and its job poller, unchanged) against the sandbox:
the Job it writes passes strict admission, the job controller runs its pod, and Metaflow reads the
outcome the way it does on a cluster. Metaflow reads $KUBECONFIG when the client is imported, so it runs in
a child process, as it would in a user's shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes
import pytest

pytest.importorskip("metaflow")

METAFLOW_SIDE = r"""
import json, sys, time
from metaflow.plugins.kubernetes.kubernetes_client import KubernetesClient
ns = sys.argv[1]
kwargs = dict(
    name="train", generate_name="t-train-", namespace=ns, step_name="train", image="python:3.12",
    image_pull_policy="IfNotPresent", command=["bash", "-c", "echo hi"], service_account=None,
    secrets=[], node_selector={}, tolerations=[], cpu="1", memory="1024", disk="2048", gpu=None,
    gpu_vendor="nvidia", timeout_in_seconds=600, retries=0, use_tmpfs=False, tmpfs_size=None,
    tmpfs_path=None, shared_memory=None, port=None, qos="burstable", persistent_volume_claims=None,
    environment_variables={"METAFLOW_CODE_URL": "s3://bucket/code"}, labels={"app": "metaflow"},
    annotations={"metaflow/step": "train"}, security_context=None, extended_resources={},
    image_pull_secrets=[])
running = KubernetesClient().job(**kwargs).create().execute()
print(json.dumps({"job": running._name, "done_at_start": running.is_done}), flush=True)
deadline = time.monotonic() + 120
while not running.is_done and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps({"done": running.is_done, "succeeded": running.has_succeeded,
                  "failed": running.has_failed}), flush=True)
"""


@pytest.mark.slow
def test_metaflow_job_runs_and_reports_success(api_sandbox, core, ns, wait):
    env = {**os.environ, "KUBECONFIG": str(api_sandbox.kubeconfig)}
    proc = subprocess.Popen([sys.executable, "-c", METAFLOW_SIDE, ns], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stdout.readline() or "{}")
        assert first.get("job", "").startswith("t-train-") and first["done_at_start"] is False, proc.stderr.read()
        [pod] = wait(lambda: core.list_namespaced_pod(ns, label_selector=f"job-name={first['job']}").items,
                     "the pod of Metaflow's job")
        assert pod.metadata.labels["app"] == "metaflow" and pod.spec.active_deadline_seconds == 600
        # what a kubelet reports when the container exits 0
        core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": pod.spec.containers[0].name, "image": "python:3.12", "imageID": "",
                                   "ready": False, "restartCount": 0, "started": False,
                                   "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                            "startedAt": "2026-11-22T01:00:00Z",
                                                            "finishedAt": "2026-11-22T01:00:01Z"}}}]}})
        out, err = proc.communicate(timeout=180)
        assert json.loads(out.strip().splitlines()[-1]) == {"done": True, "succeeded": True, "failed": False}, err
    finally:
        proc.kill()
        proc.wait()
    batch = kubernetes.client.BatchV1Api(core.api_client)
    wait(lambda: batch.read_namespaced_job(first["job"], ns).status.succeeded == 1, "the job controller's count")
    assert batch.read_namespaced_job(first["job"], ns).spec.backoff_limit == 0
