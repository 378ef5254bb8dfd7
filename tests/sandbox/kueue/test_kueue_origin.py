"""Kueue with the Liqo origin's scheduler and kubelet: a queued pod waits gated while the pool is full
and really runs once the running pod finishes and frees the quota; a preempted pod gets SIGTERM and goes."""

from __future__ import annotations

import uuid
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import pooled_as, wait_until
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.kueue.pooled import kueue_addon, kueue_origin_key
from gpu_offload.sandbox.liqo import seed as liqo

from ...origins import QUEUED
from ..kueue_setup import (
    admitted,
    cluster_queue,
    condition,
    create,
    flavor,
    gpu_pod,
    local_queue,
    workloads,
)

ONE_DONOR = QUEUED.with_donors(liqo.donors(1, gpus=1))
pooled = ONE_DONOR.fixture(name="pooled")  # the session's Kueue origin of default options, one donor of 1 A100 peered


@pytest.fixture(scope="module")
@pooled_as(kueue_origin_key(**ONE_DONOR.pool_options()))
def origin(pooled: Any) -> Any:
    return pooled.sandbox


def _pod(name: str, code: str) -> dict[str, Any]:
    body = gpu_pod(name, "user-queue")
    body["spec"]["containers"][0]["command"] = ["python3", "-c", code]
    return body


def _offloaded(core: Any, custom: Any, user: str) -> str:
    # a name of the test's own: the origin is shared, and other modules have users of these names
    ns = f"{user}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings", {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}})
    return ns


def test_queued_pod_waits_gated_then_runs_when_the_gpu_frees(origin):
    client = origin.api_client()
    core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
    ns = _offloaded(core, custom, "alice")
    create(custom, "resourceflavors", flavor("donor-1-a100", {"liqo.io/remote-cluster-id": "donor-1"},
                                             [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                               "effect": "NoExecute"}]))
    create(custom, "clusterqueues", cluster_queue("gpus", {"donor-1-a100": 1}))
    create(custom, "localqueues", local_queue("user-queue", "gpus"), ns)
    core.create_namespaced_pod(ns, _pod("first", "import time; time.sleep(2)"))
    wait_until(lambda: core.read_namespaced_pod("first", ns).status.phase == "Running", "the first pod running")
    core.create_namespaced_pod(ns, _pod("second", "print('ran')"))
    wait_until(lambda: len(workloads(custom, ns)) == 2, "two workloads")
    second = core.read_namespaced_pod("second", ns)
    assert [g.name for g in second.spec.scheduling_gates] == ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"]
    wait_until(lambda: any(c.reason == "SchedulingGated" for c in
                           core.read_namespaced_pod("second", ns).status.conditions or []), "SchedulingGated shown")
    assert core.read_namespaced_pod("first", ns).status.phase == "Running"  # still busy: second waits
    wait_until(lambda: core.read_namespaced_pod("second", ns).status.phase == "Succeeded", "the second pod run")
    assert core.read_namespaced_pod("second", ns).spec.node_name == "donor-1-gpu"
    wls = {w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads(custom, ns)}
    assert condition(wls["first"], "Finished")["reason"] == "Succeeded"
    assert admitted(wls["second"])
    assert condition(wls["first"], "Finished")["lastTransitionTime"] <= condition(
        wls["second"], "Admitted")["lastTransitionTime"]
    client.close()


TRAP_TERM = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: (print('stopping on SIGTERM', flush=True), sys.exit(0)))\n"
             "print('running', flush=True)\ntime.sleep(600)")


def test_preempted_pod_gets_sigterm_then_goes_and_the_higher_priority_pod_runs(origin):
    client = origin.api_client()
    core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
    ns = _offloaded(core, custom, "bob")
    create(custom, "resourceflavors", flavor("donor-1-any", {"liqo.io/remote-cluster-id": "donor-1"}))
    create(custom, "clusterqueues", cluster_queue("prio", {"donor-1-any": 1},
                                                  preemption={"withinClusterQueue": "LowerPriority"}))
    create(custom, "localqueues", local_queue("user-queue", "prio"), ns)
    for name, value in (("batch", 100), ("interactive", 1000)):
        create(custom, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": name},
                                                   "value": value})
    low = _pod("low", TRAP_TERM)
    low["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "batch"
    core.create_namespaced_pod(ns, low)
    wait_until(lambda: core.read_namespaced_pod("low", ns).status.phase == "Running", "the batch pod running")
    # Running means its program started, not that it trapped SIGTERM yet: wait for its own line
    wait_until(lambda: "running" in core.read_namespaced_pod_log("low", ns), "the batch pod's SIGTERM trap")
    rv = core.read_namespaced_pod("low", ns).metadata.resource_version
    high = _pod("high", "print('interactive ran')")
    high["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "interactive"
    core.create_namespaced_pod(ns, high)
    last, target = None, None
    watch = kubernetes.watch.Watch()
    for event in watch.stream(core.list_namespaced_pod, ns, field_selector="metadata.name=low",
                              resource_version=rv, timeout_seconds=60):
        last = event["object"]
        target = next((c for c in last.status.conditions or [] if c.type == "TerminationTarget"), target)
        if event["type"] == "DELETED":
            break
    watch.stop()
    assert target is not None and target.reason == "WorkloadEvictedDueToPreempted"
    state = last.status.container_statuses[0].state.terminated
    assert state is not None and state.exit_code == 0  # it stopped on SIGTERM, not SIGKILL
    wait_until(lambda: core.read_namespaced_pod("high", ns).status.phase == "Succeeded", "the interactive pod run")
    client.close()


def test_kueue_restarted_with_another_configuration_manages_the_namespaces_it_now_selects(origin, pooled,
                                                                                          origin_pool):
    """A pooled Kueue origin serves modules that configure Kueue differently by restarting Kueue with their
    options, as an admin applies a Configuration: its webhooks then manage the namespaces the new
    ``managedJobsNamespaceSelector`` selects, and its memory (fair-sharing usage) starts over."""
    options = ONE_DONOR.pool_options()
    shared = origin_pool.shared(options["crds"], addon=kueue_addon(), image_map=options["image_map"])
    kueue = shared.addon
    assert shared.running.sandbox is origin
    client = origin.api_client()
    core = kubernetes.client.CoreV1Api(client)
    name = f"unlabelled-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    before, ledger = kueue.options, kueue.controller.ledger
    try:
        core.create_namespaced_pod(name, gpu_pod("managed", "user-queue"))
        assert "kueue.x-k8s.io/admission" in [g.name for g in core.read_namespaced_pod("managed", name).spec.scheduling_gates]
        pooled.call(_restart(kueue, KueueOptions(namespace_selector={"matchLabels": {"team": "ml"}})))
        assert kueue.controller.ledger is not ledger
        core.create_namespaced_pod(name, gpu_pod("unmanaged", "user-queue"))
        assert not core.read_namespaced_pod("unmanaged", name).spec.scheduling_gates  # Kueue no longer selects it
    finally:
        core.delete_namespace(name)
        pooled.call(_restart(kueue, before))
        client.close()


async def _restart(kueue: Any, options: KueueOptions) -> None:
    kueue.restart(options)
