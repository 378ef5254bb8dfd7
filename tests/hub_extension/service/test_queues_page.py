"""The admins' Queues page through a real JupyterHub, against the sandbox origin with Kueue emulated: the
ClusterQueue the hub's controller built, quota and usage per flavor, who waits and who holds GPUs, the
priority classes; a run Kueue preempted is recorded as preempted. With queueing off the page says how to
turn it on."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ...origins import QUEUED
from ..conftest import SHARED, RunningHub, offloaded_namespace

KUEUE_CRDS = SHARED / "kueue-crds"
QUEUEING = {"kueue": {"enabled": True}}


# The session's Kueue origin of default options (tests/origins.py), the hub tests' two donors of 4 A100 peered
origin = QUEUED.with_donors(liqo.donors(2)).fixture()


@pytest.fixture(scope="module")
def queued_hub(hub_factory: Any) -> RunningHub:
    return hub_factory(queueing=QUEUEING)


def _user_namespace(client: Any, user: str) -> str:
    """What the spawner hook makes with queueing on: an offloaded user namespace owned by ``user``, and its
    LocalQueue on the hub's ClusterQueue."""
    ns = offloaded_namespace(client)
    kubernetes.client.CoreV1Api(client).patch_namespace(ns, {"metadata": {
        "labels": {"gpu-offload.io/user-namespace": "true"}, "annotations": {"gpu-offload.io/user": user}}})
    kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", ns, "localqueues", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                                          "metadata": {"name": "gpu-offload"},
                                                          "spec": {"clusterQueue": "gpu-offload"}})
    return ns


def _runner(name: str, user: str, priority: str) -> dict[str, Any]:
    """A runner-like pod: the project's labels, the queue's labels, 4 GPUs, running until stopped."""
    return {"metadata": {"name": name, "labels": {
                "gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": user,
                "kueue.x-k8s.io/queue-name": "gpu-offload", "kueue.x-k8s.io/priority-class": priority}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "runner", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(600)"],
                "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}


def test_with_queueing_off_the_page_says_how_to_turn_it_on(hub: RunningHub) -> None:
    page = hub.api("GET", "queues", "admin")
    assert page.status == 200
    assert "Queueing is off" in page.text and "queueing.kueue.enabled: true" in page.text
    assert 'href="/services/gpu-offload/queues"' in page.text  # in the navigation of every page
    assert hub.api("GET", "api/admin/queues", "admin").json()["enabled"] is False
    assert hub.api("GET", "queues", "alice").status == 403  # a plain user sees no admin page


def test_admins_see_quota_usage_waiting_and_admitted_runs_by_user_and_priorities(
        queued_hub: RunningHub, origin: RunningOrigin) -> None:
    def view() -> dict[str, Any]:
        return queued_hub.api("GET", "api/admin/queues", "vera").json()  # type: ignore[no-any-return]

    built = wait_until(lambda: (v := view())["exists"] and len(v["flavors"]) == 2 and v, "the ClusterQueue built")
    assert [(f["cluster_id"], f["quota"]["nvidia.com/gpu"]) for f in built["flavors"]] == [
        ("donor-1", "4"), ("donor-2", "4")]
    assert [(c["name"], c["value"], c["default"]) for c in built["priority_classes"]] == [
        ("interactive", 1000, True), ("batch", 100, False)]
    assert built["users"] == [] and built["fair_sharing"] and built["preemption"] == "LowerPriority"

    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    bob_user = "bob"
    alice, bob = _user_namespace(client, "alice"), _user_namespace(client, bob_user)
    try:
        for name in ("train-1", "train-2"):
            core.create_namespaced_pod(alice, _runner(name, "alice", "batch"))
        wait_until(lambda: all(core.read_namespaced_pod(n, alice).status.phase == "Running" for n in ("train-1", "train-2")),
                   "alice's two batch runs hold all 8 GPUs")
        core.create_namespaced_pod(bob, _runner("notebook", bob_user, "interactive"))  # preempts one of alice's
        wait_until(lambda: core.read_namespaced_pod("notebook", bob).status.phase == "Running", "bob's run admitted")
        core.create_namespaced_pod(bob, _runner("sweep", bob_user, "batch"))  # equal to alice's: it waits

        def settled() -> dict[str, Any] | None:
            v = view()
            users = {u["user"]: (u["admitted"], u["pending"], u["gpus_admitted"]) for u in v["users"]}
            # Kueue says why a workload waits on its next scheduling pass, not when the Workload is made
            waiting = [w for w in v["workloads"] if w["state"] == "pending" and w["message"]]
            return v if users == {"alice": (1, 0, 4), bob_user: (1, 1, 4)} and waiting else None
        shown = wait_until(settled, "one run each admitted, bob's batch run pending")
        assert sorted(f["used"]["nvidia.com/gpu"] for f in shown["flavors"]) == ["4", "4"]
        pending = [w for w in shown["workloads"] if w["state"] == "pending"]
        assert [(w["user"], w["owner"], w["priority_class"]) for w in pending] == [(bob_user, "Pod sweep", "batch")]
        assert "insufficient unused quota for nvidia.com/gpu" in pending[0]["message"]

        page = queued_hub.api("GET", "queues", "vera")
        assert page.status == 200
        for text in (bob_user, "alice", "Pod sweep", "4 / 4", "interactive (1000)", "Admission Fair Sharing"):
            assert text in page.text

        # the batch run Kueue stopped is in the usage records as preempted
        usage = wait_until(lambda: [r for r in queued_hub.api("GET", "api/me", "alice").json()["finished"]
                                    if r["preempted"]], "alice's preempted run recorded")
        assert usage[0]["pod"] in ("train-1", "train-2") and usage[0]["namespace"] == alice
        totals = queued_hub.api("GET", "api/admin/usage", "admin").json()["usage"]
        assert [t["preempted"] for t in totals if t["user"] == "alice"] == [1]
        assert "Preempted" in queued_hub.api("GET", "users", "admin").text
    finally:  # the origin is shared: even a failed run leaves no pod holding the donors' GPUs
        for ns in (alice, bob):
            core.delete_namespace(ns)
        client.close()
