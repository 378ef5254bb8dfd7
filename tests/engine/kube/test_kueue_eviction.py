"""What Kueue writes when it evicts a queued pod it had admitted, on the sandbox's emulation and on real Kueue 0.19
(tests/realcluster): the Workload's conditions the engine and the hub's queue pages read (``Evicted``, ``Admitted``,
``QuotaReserved``, ``Requeued``, then ``Finished`` once the pod is gone) and the pod's ``TerminationTarget``.
A pod that never gets ready: ``waitForPodsReady`` evicts it after its timeout (45 s on the real cluster, a few
seconds here on the sandbox) and deletes it; a plain pod is not requeued (its Workload goes with it). A running
pod whose node stops answering: Kueue waits for its recovery and finishes its Workload once Kubernetes' taint
eviction deletes the pod (on ``[real]`` the node's kubelet is killed: ``RC_NODE2`` off cluster 0)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import urllib3
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kueue import KueueOptions

from ...origins import MANAGED, KueueConfig
from ...realcluster.realorigin import node_lost
from .conftest import STOCK_IMAGE, kueue_origin_on_each_cluster
from .test_queueing import DONORS, KUEUE, QUEUE

SANDBOX_PODS_READY_TIMEOUT = 3.0
"""The sandbox Kueue's ``waitForPodsReady`` timeout here (the real cluster's is up.sh's 45 s)."""
ABSENT_IMAGE = "localhost/gpuorc/absent:1"
"""An image no node has; with ``imagePullPolicy: Never`` the pod is bound and never starts."""


SANDBOX = KueueConfig(DONORS, KueueOptions(namespace_selector=MANAGED, usage_sampling=36000.0,
                                           pods_ready_timeout=SANDBOX_PODS_READY_TIMEOUT))
origin = kueue_origin_on_each_cluster(SANDBOX)


class Versions:
    """Every version of the objects one watch reports, kept in order in a daemon thread."""

    def __init__(self, list_call: Callable[..., Any], *args: Any) -> None:
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._record, args=(list_call, args), daemon=True)
        self._thread.start()

    def _record(self, list_call: Callable[..., Any], args: tuple[Any, ...]) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(urllib3.exceptions.HTTPError, kubernetes.client.ApiException):
                for event in kubernetes.watch.Watch().stream(list_call, *args, timeout_seconds=5):
                    obj = event["object"]
                    self.seen.append(obj if isinstance(obj, dict) else obj.to_dict())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """type -> (status, reason, message) of an object's status conditions."""
    return {c["type"]: (c["status"], c.get("reason") or "", c.get("message") or "")
            for c in (obj.get("status") or {}).get("conditions") or []}


def stuck_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stuck", "labels": {
        "kueue.x-k8s.io/queue-name": QUEUE, "kueue.x-k8s.io/priority-class": "interactive"}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                  "effect": "NoExecute"}],
                 "containers": [{"name": "c", "image": ABSENT_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["python3", "-c", "pass"],
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_an_admitted_pod_that_never_gets_ready_is_evicted_deleted_and_its_workload_says_so(
        core: Any, custom: Any, user_ns: str) -> None:
    workloads = Versions(custom.list_namespaced_custom_object, *KUEUE, user_ns, "workloads")
    pods = Versions(core.list_namespaced_pod, user_ns)
    try:
        core.create_namespaced_pod(user_ns, stuck_pod())

        def gone() -> bool:
            try:
                core.read_namespaced_pod("stuck", user_ns)
            except kubernetes.client.ApiException as exc:
                return exc.status == 404
            return False
        wait_until(gone, "the pod evicted and deleted", timeout=180)
        wait_until(lambda: not custom.list_namespaced_custom_object(*KUEUE, user_ns, "workloads")["items"],
                   "the Workload gone with its pod", timeout=60)
    finally:
        workloads.stop()
        pods.stop()
    name = workloads.seen[0]["metadata"]["name"]
    admitted = [conditions(w) for w in workloads.seen if conditions(w).get("Admitted", ("",))[0] == "True"]
    assert admitted and admitted[0]["QuotaReserved"][:2] == ("True", "QuotaReserved")
    why = f"Exceeded the PodsReady timeout {user_ns}/{name}"
    # the Workload between the eviction and its pod's end: back in the queue, no admission, not requeued
    released = [w for w in workloads.seen if conditions(w).get("QuotaReserved", ("",))[0] == "False"
                and "Evicted" in conditions(w)]
    assert released, [conditions(w) for w in workloads.seen]
    said = conditions(released[0])
    assert said["Evicted"] == ("True", "PodsReadyTimeout", why)
    assert said["Admitted"] == ("False", "NoReservation", "The workload has no reservation")
    assert said["QuotaReserved"] == ("False", "Pending", why)
    assert said["Requeued"] == ("False", "PodsReadyTimeout", why)
    assert said["PodsReady"][:2] == ("False", "WaitForStart")
    assert not released[0]["status"].get("admission")
    assert released[0]["status"]["requeueState"]["count"] == 1
    # once the pod is gone: finished, its owner not found
    assert conditions(workloads.seen[-1])["Finished"] == ("True", "OwnerNotFound",
                                                          "The workload's owner no longer exists")
    # the pod was told why before it was deleted (what the engine reads: explain.py)
    told = [conditions(p)["TerminationTarget"] for p in pods.seen if "TerminationTarget" in conditions(p)]
    assert told and told[0] == ("True", "WorkloadEvictedDueToPodsReadyTimeout", why), told


def lost_node(origin: Any, node: str) -> contextlib.AbstractContextManager[None]:
    """The node's kubelet silent for the block: real Kubernetes' killed kubelet, or the sandbox's fault (its grace a
    few seconds instead of the real node controller's 50)."""
    if not hasattr(origin, "faults"):
        return node_lost(node)

    @contextlib.contextmanager
    def sandbox() -> Iterator[None]:
        origin.call(origin.faults.node_not_ready(node, grace=3.0))
        try:
            yield
        finally:
            origin.faults.node_ready(node)
    return sandbox()


def test_a_running_queued_pod_on_a_lost_node_waits_for_recovery_then_its_workload_finishes_when_evicted(
        origin: Any, core: Any, custom: Any, user_ns: str) -> None:
    """Kubernetes marks the pod not ready, then its taint eviction deletes it (a short toleration here); Kueue
    waits for recovery (no eviction of its own) and finishes the Workload once its owner is going; the admission
    stays as it was."""
    pod = stuck_pod()
    pod["metadata"]["name"] = "runs"
    pod["spec"]["terminationGracePeriodSeconds"] = 30  # the deletion waits for a kubelet that never answers
    pod["spec"]["tolerations"] += [{"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
                                   for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]
    container = pod["spec"]["containers"][0]
    container.update(image=STOCK_IMAGE, imagePullPolicy="IfNotPresent",
                     command=["python3", "-c", "import time; time.sleep(600)"])
    workloads = Versions(custom.list_namespaced_custom_object, *KUEUE, user_ns, "workloads")
    try:
        core.create_namespaced_pod(user_ns, pod)
        running = wait_until(lambda: (p := core.read_namespaced_pod("runs", user_ns)).status.phase == "Running" and p,
                             "the queued pod admitted and running", timeout=120)
        wait_until(lambda: any(conditions(w).get("PodsReady", ("",))[0] == "True" for w in workloads.seen),
                   "Kueue seeing the pod started", timeout=60)
        with lost_node(origin, running.spec.node_name):
            wait_until(lambda: core.read_namespaced_pod("runs", user_ns).metadata.deletion_timestamp,
                       "the pod evicted from the silent node", timeout=180)
            finished = wait_until(lambda: [w for w in workloads.seen if "Finished" in conditions(w)],
                                  "the Workload finished", timeout=60)
            with contextlib.suppress(kubernetes.client.ApiException):
                core.delete_namespaced_pod("runs", user_ns, grace_period_seconds=0)  # nobody on the node confirms
    finally:
        workloads.stop()
    recovering = [conditions(w)["PodsReady"] for w in workloads.seen if "PodsReady" in conditions(w)]
    assert ("False", "WaitForRecovery", "At least one pod has failed, waiting for recovery") in recovering, \
        sorted(set(recovering))
    said = conditions(finished[0])
    assert said["Finished"] == ("True", "OwnerNotFound", "The workload's owner no longer exists")
    assert said["Admitted"][:2] == ("True", "Admitted") and said["QuotaReserved"][:2] == ("True", "QuotaReserved")
    assert not any("Evicted" in conditions(w) for w in workloads.seen)  # Kueue evicted nothing itself
