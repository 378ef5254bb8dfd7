"""waitForPodsReady in the emulated Kueue: a Job whose pods never become ready is evicted after the
timeout, stopped (suspended), requeued with backoff and admitted again."""

from __future__ import annotations

import uuid

import kubernetes
import pytest
from gpu_offload.sandbox.apiserver.crds import load_crd_dir, schema_errors
from gpu_offload.sandbox.fixtures import wait_until

from ..kueue_setup import (
    KUEUE_CRDS,
    condition,
    gpu_pod,
    kueue_sandbox,
    one_queue_pool,
    workloads,
)

pytestmark = pytest.mark.e2e  # starts sandboxes: the end-to-end lane


def test_job_that_never_gets_ready_is_evicted_requeued_and_admitted_again(tmp_path):
    # the bare API has no kubelet: nothing ever becomes ready
    with kueue_sandbox(tmp_path, pods_ready_timeout=0.5, requeue_base_seconds=0.5) as sb:
        client = sb.api_client()
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        batch = kubernetes.client.BatchV1Api(client)
        ns = f"u-{uuid.uuid4().hex[:6]}"
        one_queue_pool(core, custom, ns)
        batch.create_namespaced_job(ns, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "stuck", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
            "spec": {"template": {"spec": gpu_pod("x", "q")["spec"]}}})

        def requeued_twice():
            wls = workloads(custom, ns)
            return wls and ((wls[0]["status"].get("requeueState") or {}).get("count") or 0) >= 2 and wls[0]
        wl = wait_until(requeued_twice, "two waitForPodsReady requeues")
        evicted = condition(wl, "Evicted")
        assert evicted["reason"] == "PodsReadyTimeout"
        assert evicted["message"] == f"Exceeded the PodsReady timeout {ns}/{wl['metadata']['name']}"
        # the sandbox aggregates repeated events into one with a count, as client-go's correlator does
        seen: dict[str, int] = {}
        for e in core.list_namespaced_event(ns).items:
            seen[e.reason] = seen.get(e.reason, 0) + (e.count or 1)
        assert seen.get("EvictedDueToPodsReadyTimeout", 0) >= 2 and seen.get("Admitted", 0) >= 2
        assert "Stopped" in seen  # the Job was suspended at each eviction
        client.close()


def test_without_kueues_crds_the_builtin_description_serves_and_admits(tmp_path):
    with kueue_sandbox(tmp_path, crds=False) as sb:
        client = sb.api_client()
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        one_queue_pool(core, custom, "u")
        core.create_namespaced_pod("u", gpu_pod("p", "q"))
        wait_until(lambda: (w := workloads(custom, "u")) and (condition(w[0], "Admitted") or {}).get("status")
                   == "True", "admitted with the built-in CRDs")
        assert not core.read_namespaced_pod("p", "u").spec.scheduling_gates
        client.close()


def test_plain_pod_that_never_gets_ready_is_stopped_as_kueue_does(tmp_path):
    # a plain pod cannot be suspended: Kueue marks it TerminationTarget and deletes it (its Workload goes too)
    with kueue_sandbox(tmp_path, pods_ready_timeout=0.5) as sb:
        client = sb.api_client()
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        one_queue_pool(core, custom, "u")
        rv = core.list_namespaced_pod("u").metadata.resource_version
        core.create_namespaced_pod("u", gpu_pod("stuck", "q"))
        target = None
        watch = kubernetes.watch.Watch()
        for event in watch.stream(core.list_namespaced_pod, "u", resource_version=rv, timeout_seconds=30):
            conditions = event["object"].status.conditions or []
            target = next((c for c in conditions if c.type == "TerminationTarget"), target)
            if event["type"] == "DELETED":
                break
        watch.stop()
        assert target is not None and target.reason == "WorkloadEvictedDueToPodsReadyTimeout"
        assert target.message.startswith("Exceeded the PodsReady timeout u/pod-stuck-")
        wait_until(lambda: not workloads(custom, "u"), "the Workload gone with its pod")
        client.close()


def test_local_queue_reports_its_fair_sharing_usage_valid_against_the_crd(tmp_path):
    with kueue_sandbox(tmp_path, usage_sampling=0.3, usage_half_life=60) as sb:
        client = sb.api_client()
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        one_queue_pool(core, custom, "u")
        custom.patch_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "pool", {
            "spec": {"admissionScope": {"admissionMode": "UsageBasedAdmissionFairSharing"}}})
        core.create_namespaced_pod("u", gpu_pod("p", "q"))

        def usage():
            lq = custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "u", "localqueues", "q")
            afs = ((lq.get("status") or {}).get("fairSharing") or {}).get("admissionFairSharingStatus") or {}
            return afs.get("consumedResources", {}).get("nvidia.com/gpu") not in (None, "0") and lq
        lq = wait_until(usage, "the LocalQueue's consumed GPUs")
        assert schema_errors(lq, load_crd_dir(KUEUE_CRDS)) == []
        assert lq["status"]["admittedWorkloads"] == 1 and lq["status"]["pendingWorkloads"] == 0
        client.close()
