"""Scheduling decisions as users see them: where pods land, and the FailedScheduling they read."""

from __future__ import annotations

import uuid

from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from ...origins import TWO_A100

origin = TWO_A100.with_donors(liqo.donors(1, gpus=2)).fixture()  # the kubelet tests' origin, one donor of 2 A100 peered
core, custom, namespace, offloaded_namespace = (fixtures.core, fixtures.custom, fixtures.namespace,
                                               fixtures.offloaded_namespace)

TOLERATE = [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}]


def _pod(name: str, gpus: int = 0, code: str = "print('ok')", **spec) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "python:3.11", "command": ["python3", "-c", code],
                            "resources": {"limits": limits}}], **spec}}


def _events(core, offloaded_namespace: str, pod: str, reason: str) -> list:
    return [e for e in core.list_namespaced_event(offloaded_namespace).items
            if e.involved_object.name == pod and e.reason == reason]


def test_gpu_pod_without_liqo_toleration_gets_the_real_failed_scheduling_message(core):
    name = f"plain-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("default", _pod(name, gpus=1))
    event = wait_until(lambda: _events(core, "default", name, "FailedScheduling"), "FailedScheduling")[0]
    assert event.type == "Warning"
    assert event.message == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {virtual-node.liqo.io/not-allowed: true}, "
        "2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
        "1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod.")
    pod = core.read_namespaced_pod(name, "default")
    assert pod.spec.node_name is None and pod.status.phase == "Pending"
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert (cond.status, cond.reason, cond.message) == ("False", "Unschedulable", event.message)
    core.delete_namespaced_pod(name, "default")


def test_pods_land_by_resources_and_selectors(core, offloaded_namespace):
    core.create_namespaced_pod(offloaded_namespace, _pod("gpu", gpus=1))
    core.create_namespaced_pod(offloaded_namespace, _pod("cpu", nodeSelector={"hub.jupyter.org/node-purpose": "user"}))
    gpu = wait_until(lambda: (p := core.read_namespaced_pod("gpu", offloaded_namespace)).spec.node_name and p, "gpu bound")
    cpu = wait_until(lambda: (p := core.read_namespaced_pod("cpu", offloaded_namespace)).spec.node_name and p, "cpu bound")
    assert (gpu.spec.node_name, cpu.spec.node_name) == ("donor-1-gpu", "origin-user")
    assert _events(core, offloaded_namespace, "gpu", "Scheduled")[0].message == f"Successfully assigned {offloaded_namespace}/gpu to donor-1-gpu"


def test_a_pod_waits_for_gpus_and_is_bound_when_they_are_freed(core, offloaded_namespace):
    core.create_namespaced_pod(offloaded_namespace, _pod("holder", gpus=2, code="import time; time.sleep(600)"))
    wait_until(lambda: core.read_namespaced_pod("holder", offloaded_namespace).status.phase == "Running", "holder running")
    core.create_namespaced_pod(offloaded_namespace, _pod("waiter", gpus=1))
    event = wait_until(lambda: _events(core, offloaded_namespace, "waiter", "FailedScheduling"), "FailedScheduling")[0]
    assert event.message.startswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    core.delete_namespaced_pod("holder", offloaded_namespace)
    done = wait_until(lambda: (p := core.read_namespaced_pod("waiter", offloaded_namespace)).status.phase == "Succeeded" and p,
                      "the waiting pod to run once GPUs are free")
    assert done.spec.node_name == "donor-1-gpu"


def test_cordoned_node_takes_no_new_pods(core, offloaded_namespace):
    core.patch_node("origin-user", {"spec": {"unschedulable": True}})
    try:
        core.create_namespaced_pod(offloaded_namespace, _pod("cordoned", nodeSelector={"hub.jupyter.org/node-purpose": "user"}))
        event = wait_until(lambda: _events(core, offloaded_namespace, "cordoned", "FailedScheduling"), "FailedScheduling")[0]
        assert "1 node(s) were unschedulable" in event.message
    finally:
        # as `kubectl uncordon` patches it: the field removed (Kubernetes omits a false unschedulable), so the
        # shared origin's node is as it was
        core.patch_node("origin-user", {"spec": {"unschedulable": None}})
    assert wait_until(lambda: core.read_namespaced_pod("cordoned", offloaded_namespace).spec.node_name, "bound after uncordon") \
        == "origin-user"


def test_an_uncordoned_node_reads_back_as_one_never_cordoned(core):
    """``spec.unschedulable`` is a Go bool with omitempty: kube-apiserver stores no ``false``."""
    core.patch_node("donor-1-gpu", {"spec": {"unschedulable": True}})
    try:
        assert core.read_node("donor-1-gpu").spec.unschedulable is True
    finally:
        core.patch_node("donor-1-gpu", {"spec": {"unschedulable": False}})
    assert core.read_node("donor-1-gpu").spec.unschedulable is None
    assert "unschedulable" not in (core.api_client.sanitize_for_serialization(core.read_node("donor-1-gpu")).get("spec") or {})
