"""Kueue emulated in the sandbox, through the official client: webhook, Workloads, admission order,
Admission Fair Sharing, preemption, Jobs, the visibility API, and every object valid against Kueue's CRDs."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.apiserver.crds import load_crd_dir, schema_errors
from gpu_offload.sandbox.fixtures import wait_until

from ..kueue_setup import (
    GPU,
    KUEUE_CRDS,
    admitted,
    cluster_queue,
    condition,
    create,
    flavor,
    gpu_pod,
    kueue_sandbox,
    local_queue,
    workloads,
)

TAINT_TOLERATION = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with kueue_sandbox(tmp_path_factory.mktemp("kueue")) as sb:
        yield sb


@pytest.fixture(scope="module")
def client(sandbox: Any) -> Iterator[kubernetes.client.ApiClient]:
    c = sandbox.api_client()
    yield c
    c.close()


@pytest.fixture(scope="module")
def core(client: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(client)


@pytest.fixture(scope="module")
def custom(client: Any) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)


@pytest.fixture()
def pool(core: Any, custom: Any) -> Iterator[Any]:
    """A fresh ClusterQueue of two flavors (2 GPUs each) and three user namespaces with a LocalQueue each."""
    tag = uuid.uuid4().hex[:6]
    create(custom, "resourceflavors", flavor(f"a-{tag}", {"liqo.io/remote-cluster-id": "donor-1"},
                                             [TAINT_TOLERATION]))
    create(custom, "resourceflavors", flavor(f"b-{tag}", {"liqo.io/remote-cluster-id": "donor-2"}))
    cq = f"pool-{tag}"

    class Pool:
        name = cq
        flavors = (f"a-{tag}", f"b-{tag}")
        users: list[str] = []

        def queue(self, **spec: Any) -> None:
            create(custom, "clusterqueues", cluster_queue(cq, {self.flavors[0]: 2, self.flavors[1]: 2}, **spec))
            for user in ("ann", "bob", "cat"):
                ns = f"{user}-{tag}"
                core.create_namespace({"metadata": {"name": ns}})
                create(custom, "localqueues", local_queue("user-queue", cq), ns)
                self.users.append(ns)

    p = Pool()
    p.users = []
    yield p
    for ns in p.users:
        core.delete_namespace(ns)


def _wl_of(custom: Any, ns: str, pod: str) -> dict[str, Any] | None:
    return next((w for w in workloads(custom, ns)
                 if any(r["name"] == pod for r in w["metadata"].get("ownerReferences") or [])), None)


def _admission_order(custom: Any, namespaces: list[str]) -> list[str]:
    done = []
    for ns in namespaces:
        for w in workloads(custom, ns):
            cond = condition(w, "Admitted")
            if cond and cond["status"] == "True":
                done.append((cond["lastTransitionTime"], w["metadata"]["resourceVersion"],
                             w["metadata"]["ownerReferences"][0]["name"]))
    return [name for *_, name in sorted(done, key=lambda d: (d[0], int(d[1])))]


def _a_second_later(custom: Any, ns: str) -> None:
    """Wait until every pod of ``ns`` has its Workload and the clock is in a later second: Kueue orders Workloads
    by creation time in whole seconds and then by UID, so only a later second queues a pod behind another."""
    wait_until(lambda: len(workloads(custom, ns)) == len(kubernetes.client.CoreV1Api(custom.api_client)
                                                           .list_namespaced_pod(ns).items), "every pod's Workload")
    time.sleep(1.05 - time.time() % 1.0)


def test_webhook_gates_labels_and_builds_a_workload_and_leaves_unqueued_pods_alone(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    pod = core.create_namespaced_pod(ns, gpu_pod("p1", "user-queue"))
    assert pod.metadata.labels["kueue.x-k8s.io/managed"] == "true"
    # Kueue 0.19's webhook: both gates and its finalizer (tests/realcluster/test_real_kueue.py sees the same)
    assert [g.name for g in pod.spec.scheduling_gates] == ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"]
    assert pod.metadata.finalizers == ["kueue.x-k8s.io/managed"]
    plain = core.create_namespaced_pod(ns, {**gpu_pod("plain", "x"), "metadata": {"name": "plain"}})
    assert not plain.spec.scheduling_gates and "kueue.x-k8s.io/managed" not in (plain.metadata.labels or {})
    wl = wait_until(lambda: _wl_of(custom, ns, "p1"), "the pod's Workload")
    assert wl["metadata"]["name"].startswith("pod-p1-") and wl["spec"]["podSets"][0]["count"] == 1
    wl = wait_until(lambda: (w := _wl_of(custom, ns, "p1")) and admitted(w) and w, "admission")
    assert condition(wl, "QuotaReserved")["message"] == f"Quota reserved in ClusterQueue {pool.name}"
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"] == {GPU: pool.flavors[0]}
    pod = core.read_namespaced_pod("p1", ns)
    assert not pod.spec.scheduling_gates
    assert pod.spec.node_selector == {"liqo.io/remote-cluster-id": "donor-1"}
    assert any(t.key == "virtual-node.liqo.io/not-allowed" for t in pod.spec.tolerations)
    messages = {e.reason: e.message for e in core.list_namespaced_event(ns).items}
    assert re.fullmatch(rf"Quota reserved in ClusterQueue {pool.name}, wait time since queued was \d+s",
                        messages["QuotaReserved"])
    assert messages["Started"] == f"Admitted by clusterQueue {pool.name}"
    assert messages["CreatedWorkload"] == f"Created Workload: {ns}/{wl['metadata']['name']}"


def test_contended_pool_admits_by_priority_then_creation_and_reports_positions(core, custom, pool, client):
    create(custom, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass",
                                               "metadata": {"name": f"high-{pool.name}"}, "value": 1000})
    pool.queue()
    ns = pool.users[0]
    for i in range(4):  # fill the pool
        core.create_namespaced_pod(ns, gpu_pod(f"fill-{i}", "user-queue"))
    wait_until(lambda: len([w for w in workloads(custom, ns) if admitted(w)]) == 4, "4 admitted")
    for name in ("w2", "w1"):  # names against creation order: FIFO goes by creation
        _a_second_later(custom, ns)
        core.create_namespaced_pod(ns, gpu_pod(name, "user-queue"))
    core.create_namespaced_pod(ns, gpu_pod("a-urgent", "user-queue", priority=f"high-{pool.name}"))
    wait_until(lambda: len(workloads(custom, ns)) == 7, "7 workloads")
    path = f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues/user-queue/pendingworkloads"

    def pending() -> list[dict[str, Any]]:
        body = client.call_api(path, "GET", response_types_map={200: "object"}, auth_settings=["BearerToken"],
                               _return_http_data_only=True)
        return body["items"]  # type: ignore[no-any-return]
    items = wait_until(lambda: (p := pending()) and len(p) == 3 and p, "3 pending")
    owners = [i["metadata"]["ownerReferences"][0]["name"] for i in items]
    assert owners == ["a-urgent", "w2", "w1"]
    assert [(i["positionInClusterQueue"], i["positionInLocalQueue"]) for i in items] == [(0, 0), (1, 1), (2, 2)]
    assert items[0]["priority"] == 1000 and items[0]["localQueueName"] == "user-queue"
    cond = condition(_wl_of(custom, ns, "w1"), "QuotaReserved")
    assert cond["reason"] == "Pending"  # Kueue 0.19's, with its UnadmittedWorkloadsObservability gate off
    assert cond["message"].startswith(
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu")
    for i in range(3):  # quota frees one GPU at a time
        core.delete_namespaced_pod(f"fill-{i}", ns)
        wait_until(lambda i=i: len(pending()) == 2 - i, f"{i + 1} admitted from the queue")
    assert _admission_order(custom, [ns])[-3:] == ["a-urgent", "w2", "w1"]
    pod = core.read_namespaced_pod("w1", ns)
    assert not pod.spec.scheduling_gates and pod.spec.node_selector
    cq = custom.get_cluster_custom_object_status("kueue.x-k8s.io", "v1beta2", "clusterqueues", pool.name)
    assert cq["status"]["admittedWorkloads"] == 4 and cq["status"]["pendingWorkloads"] == 0


def test_higher_priority_preempts_lower_pod_gets_condition_and_is_deleted(core, custom, pool):
    for name, value in ((f"batch-{pool.name}", 100), (f"inter-{pool.name}", 1000)):
        create(custom, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": name},
                                                   "value": value})
    pool.queue(preemption={"withinClusterQueue": "LowerPriority"})
    ns = pool.users[0]
    w = kubernetes.watch.Watch()
    for i in range(4):
        core.create_namespaced_pod(ns, gpu_pod(f"batch-{i}", "user-queue", priority=f"batch-{pool.name}"))
        wait_until(lambda i=i: (wl := _wl_of(custom, ns, f"batch-{i}")) and admitted(wl), "batch admitted")
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    core.create_namespaced_pod(ns, gpu_pod("interactive", "user-queue", 2, priority=f"inter-{pool.name}"))
    seen: dict[str, Any] = {}
    deleted: set[str] = set()
    for event in w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=30):
        pod = event["object"]
        for cond in pod.status.conditions or []:
            if cond.type == "TerminationTarget":
                seen[pod.metadata.name] = cond
        if event["type"] == "DELETED":
            deleted.add(pod.metadata.name)
        if len(deleted) == 2:
            break
    w.stop()
    # the first flavor (in the ClusterQueue's order) where lower priorities can make room: batch-0 and batch-1
    assert set(seen) == deleted == {"batch-0", "batch-1"}
    cond = next(iter(seen.values()))
    assert cond.reason == "WorkloadEvictedDueToPreempted"
    assert cond.message.startswith("Preempted to accommodate a workload (UID: ")
    assert "due to prioritization in the ClusterQueue" in cond.message
    wait_until(lambda: (wl := _wl_of(custom, ns, "interactive")) and admitted(wl), "the interactive run admitted")
    reasons = {e.reason for e in core.list_namespaced_event(ns).items}
    assert {"EvictedDueToPreempted", "Stopped", "Admitted", "QuotaReserved"} <= reasons


def test_admission_fair_sharing_puts_a_heavy_users_backlog_behind_lighter_users(core, custom, pool):
    pool.queue(admissionScope={"admissionMode": "UsageBasedAdmissionFairSharing"})
    ann, bob, cat = pool.users
    for i in range(4):
        core.create_namespaced_pod(ann, gpu_pod(f"ann-run-{i}", "user-queue"))
    wait_until(lambda: len([w for w in workloads(custom, ann) if admitted(w)]) == 4, "ann fills the pool")
    for i in range(6):
        core.create_namespaced_pod(ann, gpu_pod(f"ann-q-{i}", "user-queue"))
    for ns in (bob, cat):
        for i in range(2):
            core.create_namespaced_pod(ns, gpu_pod(f"{ns[:3]}-q-{i}", "user-queue"))
    wait_until(lambda: sum(len(workloads(custom, n)) for n in pool.users) == 14, "14 workloads")
    for i in range(4):
        core.delete_namespaced_pod(f"ann-run-{i}", ann)
    after = wait_until(lambda: (o := _admission_order(custom, pool.users)) and len(o) == 4 and not any(
        n.startswith("ann-run") for n in o) and o, "4 queued runs admitted")
    assert sorted(after) == ["bob-q-0", "bob-q-1", "cat-q-0", "cat-q-1"], after


def test_job_is_created_suspended_and_unsuspended_at_admission(client, core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    batch = kubernetes.client.BatchV1Api(client)
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train",
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}},
            "spec": {"parallelism": 2, "completions": 2, "template": {"spec": gpu_pod("x", "q")["spec"]}}}
    job = batch.create_namespaced_job(ns, body)
    assert job.spec.suspend is True
    wl = wait_until(lambda: (w := _wl_of(custom, ns, "train")) and admitted(w) and w, "the Job admitted")
    assert wl["metadata"]["name"].startswith("job-train-") and wl["spec"]["podSets"][0]["count"] == 2
    job = wait_until(lambda: (j := batch.read_namespaced_job("train", ns)) and not j.spec.suspend and j, "unsuspended")
    assert job.spec.template.spec.node_selector == {"liqo.io/remote-cluster-id": "donor-1"}
    pods = wait_until(lambda: core.list_namespaced_pod(ns, label_selector="job-name=train").items, "job pods")
    assert not any(p.spec.scheduling_gates for p in pods)  # the Job's pods are not gated again


def test_every_kueue_object_validates_against_the_crds(core, custom, pool, sandbox):
    pool.queue(preemption={"withinClusterQueue": "LowerPriority"},
               admissionScope={"admissionMode": "UsageBasedAdmissionFairSharing"})
    ns = pool.users[0]
    for i in range(5):
        core.create_namespaced_pod(ns, gpu_pod(f"v-{i}", "user-queue"))
    wait_until(lambda: len(workloads(custom, ns)) == 5 and sum(map(admitted, workloads(custom, ns))) == 4,
               "4 admitted, 1 pending")
    crds = load_crd_dir(KUEUE_CRDS)
    lq = wait_until(lambda: (q := custom.get_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", ns, "localqueues", "user-queue")).get("status", {}).get("pendingWorkloads")
        == 1 and q, "the LocalQueue's status")  # written at all: the API refuses a status its CRD does not allow
    cq = wait_until(lambda: (q := custom.get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", pool.name)).get("status", {}).get("admittedWorkloads")
        == 4 and q, "the ClusterQueue's status")
    objects = [*workloads(custom, ns), lq, cq]
    for obj in objects:
        assert schema_errors(obj, crds) == [], obj["metadata"]["name"]


def _pending_path(ns: str, lq: str, version: str = "v1beta2") -> str:
    return f"/apis/visibility.kueue.x-k8s.io/{version}/namespaces/{ns}/localqueues/{lq}/pendingworkloads"


def test_strict_fifo_holds_later_workloads_behind_a_head_that_does_not_fit(core, custom, pool, client):
    pool.queue(queueingStrategy="StrictFIFO")
    ns = pool.users[0]
    core.create_namespaced_pod(ns, gpu_pod("one", "user-queue"))
    wait_until(lambda: (w := _wl_of(custom, ns, "one")) and admitted(w), "one admitted")
    core.create_namespaced_pod(ns, gpu_pod("big", "user-queue", 2))  # flavor a has 1 free: big goes to b
    wait_until(lambda: (w := _wl_of(custom, ns, "big")) and admitted(w), "big admitted in flavor b")
    core.create_namespaced_pod(ns, gpu_pod("huge", "user-queue", 2))
    _a_second_later(custom, ns)
    core.create_namespaced_pod(ns, gpu_pod("tiny", "user-queue"))
    # flavor a has 1 GPU free: tiny would fit, but huge (2 GPUs) is the head and StrictFIFO waits for it
    def queued() -> list[str]:
        body = client.call_api(_pending_path(ns, "user-queue"), "GET", response_types_map={200: "object"},
                               auth_settings=["BearerToken"], _return_http_data_only=True)
        return [i["metadata"]["ownerReferences"][0]["name"] for i in body["items"]]
    wait_until(lambda: queued() == ["huge", "tiny"], "both in the queue, huge at the head")  # a pass saw tiny
    assert not admitted(_wl_of(custom, ns, "tiny")) and not admitted(_wl_of(custom, ns, "huge"))
    core.delete_namespaced_pod("one", ns)  # flavor a frees up: huge (the head) goes first, then tiny waits
    wait_until(lambda: (w := _wl_of(custom, ns, "huge")) and admitted(w), "huge admitted once it fits")
    assert not admitted(_wl_of(custom, ns, "tiny"))


def test_best_effort_fifo_admits_a_later_workload_that_fits(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    for name, gpus in (("a", 2), ("b", 1)):
        core.create_namespaced_pod(ns, gpu_pod(name, "user-queue", gpus))
    wait_until(lambda: sum(map(admitted, workloads(custom, ns))) == 2, "a and b admitted")
    core.create_namespaced_pod(ns, gpu_pod("huge", "user-queue", 2))
    core.create_namespaced_pod(ns, gpu_pod("tiny", "user-queue"))
    wait_until(lambda: (w := _wl_of(custom, ns, "tiny")) and admitted(w), "tiny admitted past huge")
    assert not admitted(_wl_of(custom, ns, "huge"))


def test_a_request_no_flavor_can_ever_hold_says_so(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    core.create_namespaced_pod(ns, gpu_pod("too-big", "user-queue", 3))
    wl = wait_until(lambda: (w := _wl_of(custom, ns, "too-big")) and condition(w, "QuotaReserved") and w,
                    "the verdict")
    assert condition(wl, "QuotaReserved")["reason"] == "Pending"
    too_big = ("insufficient quota for nvidia.com/gpu in flavor {}, previously considered podsets requests (0) + "
               "current podset request (3) > maximum capacity (2)")
    assert condition(wl, "QuotaReserved")["message"] == "couldn't assign flavors to pod set main: " + ", ".join(
        too_big.format(flavor) for flavor in sorted(pool.flavors))


def test_pod_group_gets_one_workload_once_complete_and_is_admitted_whole(core, custom, pool):
    pool.queue()
    ns = pool.users[0]

    def member(name: str) -> dict[str, Any]:
        body = gpu_pod(name, "user-queue", **{"kueue.x-k8s.io/pod-group-name": "team"})
        body["metadata"]["annotations"] = {"kueue.x-k8s.io/pod-group-total-count": "2"}
        return body
    core.create_namespaced_pod(ns, member("m0"))
    assert not workloads(custom, ns)  # one of two: no Workload yet
    core.create_namespaced_pod(ns, member("m1"))
    wl = wait_until(lambda: (ws := workloads(custom, ns)) and admitted(ws[0]) and ws[0], "the group admitted")
    assert wl["metadata"]["name"] == "team" and wl["spec"]["podSets"][0]["count"] == 2
    assert {r["name"] for r in wl["metadata"]["ownerReferences"]} == {"m0", "m1"}
    assert all(not core.read_namespaced_pod(n, ns).spec.scheduling_gates for n in ("m0", "m1"))


def test_withdrawn_queued_pod_leaves_no_workload(core, custom, pool, client):
    pool.queue()
    ns = pool.users[0]
    for i in range(5):
        core.create_namespaced_pod(ns, gpu_pod(f"p{i}", "user-queue"))
    wait_until(lambda: len(workloads(custom, ns)) == 5 and sum(map(admitted, workloads(custom, ns))) == 4, "full")
    core.delete_namespaced_pod("p4", ns)  # Ctrl-C while queued
    wait_until(lambda: len(workloads(custom, ns)) == 4, "the queued Workload gone")
    items = client.call_api(_pending_path(ns, "user-queue"), "GET", response_types_map={200: "object"},
                            auth_settings=["BearerToken"], _return_http_data_only=True)["items"]
    assert items == []  # not listed, even before the next pass


def test_unmanaged_namespace_and_unknown_priority_class(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    pod = core.create_namespaced_pod("kube-system", gpu_pod(f"sys-{pool.name}", "user-queue"))
    assert not pod.spec.scheduling_gates  # outside managedJobsNamespaceSelector
    core.delete_namespaced_pod(pod.metadata.name, "kube-system")
    core.create_namespaced_pod(ns, gpu_pod("typo", "user-queue", priority="no-such-class"))
    event = wait_until(lambda: [e for e in core.list_namespaced_event(ns).items
                                if e.reason == "WorkloadPriorityClassNotFound"], "the warning")[0]
    assert event.type == "Warning" and "no-such-class" in event.message
    assert not workloads(custom, ns)


def test_visibility_refuses_unknown_queues_and_bad_paging(client, pool):
    pool.queue()
    ns = pool.users[0]
    with pytest.raises(kubernetes.client.ApiException) as err:
        client.call_api(_pending_path(ns, "nope"), "GET", auth_settings=["BearerToken"])
    assert err.value.status == 404 and "nope" in err.value.body
    with pytest.raises(kubernetes.client.ApiException) as err:
        client.call_api(_pending_path(ns, "user-queue"), "GET", query_params=[("limit", "x")],
                        auth_settings=["BearerToken"])
    assert err.value.status == 400
    ok = client.call_api(_pending_path(ns, "user-queue", "v1beta1"), "GET", response_types_map={200: "object"},
                         auth_settings=["BearerToken"], _return_http_data_only=True)
    assert ok["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1" and ok["kind"] == "PendingWorkloadsSummary"


@pytest.mark.parametrize(("labels", "annotations", "field"), [
    ({"kueue.x-k8s.io/pod-group-name": "g"}, {}, "metadata.annotations[kueue.x-k8s.io/pod-group-total-count]"),
    ({"kueue.x-k8s.io/pod-group-name": "g"}, {"kueue.x-k8s.io/pod-group-total-count": "0"},
     "metadata.annotations[kueue.x-k8s.io/pod-group-total-count]"),
    ({}, {"kueue.x-k8s.io/pod-group-total-count": "2"}, "metadata.labels[kueue.x-k8s.io/pod-group-name]"),
])
def test_bad_pod_group_metadata_is_refused_and_nothing_is_left(core, custom, pool, labels, annotations, field):
    pool.queue()
    ns = pool.users[0]
    body = gpu_pod("member", "user-queue", **labels)
    body["metadata"]["annotations"] = annotations
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.create_namespaced_pod(ns, body)
    assert err.value.status == 422 and field in err.value.body
    assert not core.list_namespaced_pod(ns).items and not workloads(custom, ns)


def test_pod_for_a_missing_local_queue_waits_gated_and_its_workload_says_why(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    core.create_namespaced_pod(ns, gpu_pod("lost", "no-such-queue"))
    wl = wait_until(lambda: (w := _wl_of(custom, ns, "lost")) and condition(w, "QuotaReserved") and w, "verdict")
    cond = condition(wl, "QuotaReserved")
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False", "Inadmissible", "LocalQueue no-such-queue doesn't exist")
    assert core.read_namespaced_pod("lost", ns).spec.scheduling_gates


def test_hand_set_managed_label_never_queues_a_pod_without_a_queue(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    sneaky = gpu_pod("sneaky", "q", **{"kueue.x-k8s.io/managed": "true"})
    del sneaky["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    core.create_namespaced_pod(ns, sneaky)
    core.create_namespaced_pod(ns, gpu_pod("after", "user-queue"))  # the controller still works after it
    wait_until(lambda: (w := _wl_of(custom, ns, "after")) and admitted(w), "the next pod admitted")
    assert _wl_of(custom, ns, "sneaky") is None


def test_cluster_queue_without_namespace_selector_admits_no_namespace(core, custom, pool):
    pool.queue()
    ns = pool.users[0]
    cq = cluster_queue(f"closed-{pool.name}", {pool.flavors[0]: 1})
    del cq["spec"]["namespaceSelector"]
    create(custom, "clusterqueues", cq)
    create(custom, "localqueues", local_queue("closed", cq["metadata"]["name"]), ns)
    core.create_namespaced_pod(ns, gpu_pod("shut-out", "closed"))
    wl = wait_until(lambda: (w := _wl_of(custom, ns, "shut-out")) and condition(w, "QuotaReserved") and w, "verdict")
    cond = condition(wl, "QuotaReserved")
    assert (cond["reason"], cond["message"]) == ("Inadmissible",
                                                 "workload namespace doesn't match ClusterQueue selector")


def test_a_running_pods_priority_class_may_change_and_its_workload_follows(core, custom, pool):
    """Kueue v0.15 on: the label moves from one class to another on a running pod and the Workload's priority
    follows (how the project lowers a protected session); it may not be removed, nor added once admitted."""
    protected, batch, inter = (f"{n}-{pool.name}" for n in ("protected", "batch", "inter"))
    for name, value in ((protected, 100000), (batch, 100), (inter, 1000)):
        create(custom, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": name},
                                                   "value": value})
    pool.queue(preemption={"withinClusterQueue": "LowerPriority"})
    ns = pool.users[0]
    core.create_namespaced_pod(ns, gpu_pod("plain", "user-queue"))  # no class
    # Kueue ungates the pod a moment after it admits the Workload: until then the pod is still suspended and
    # may get a class, so the refusal is asked of the pod once it is ungated
    wait_until(lambda: ((wl := _wl_of(custom, ns, "plain")) and admitted(wl)
                        and not core.read_namespaced_pod("plain", ns).spec.scheduling_gates),
               "the plain pod admitted and ungated")
    with pytest.raises(kubernetes.client.ApiException) as added:
        core.patch_namespaced_pod("plain", ns, {"metadata": {"labels": {"kueue.x-k8s.io/priority-class": batch}}})
    assert added.value.status == 422 and "cannot be added to a non-suspended workload" in added.value.body
    core.delete_namespaced_pod("plain", ns, grace_period_seconds=0)
    wait_until(lambda: "plain" not in {p.metadata.name for p in core.list_namespaced_pod(ns).items}
               and (_wl_of(custom, ns, "plain") is None or not admitted(_wl_of(custom, ns, "plain"))),
               "the plain pod gone and its quota released")
    for i in range(4):
        core.create_namespaced_pod(ns, gpu_pod(f"s-{i}", "user-queue", priority=protected))
        wait_until(lambda i=i: (wl := _wl_of(custom, ns, f"s-{i}")) and admitted(wl), "session admitted")
    core.patch_namespaced_pod("s-2", ns, {"metadata": {"labels": {"kueue.x-k8s.io/priority-class": batch}}})
    wait_until(lambda: (_wl_of(custom, ns, "s-2") or {})["spec"].get("priority") == 100, "the Workload lowered")
    assert _wl_of(custom, ns, "s-2")["spec"]["priorityClassRef"]["name"] == batch
    # a full pool: the interactive pod preempts the lowered one only, the protected ones stay
    core.create_namespaced_pod(ns, gpu_pod("interactive", "user-queue", priority=inter))
    wait_until(lambda: "s-2" not in {p.metadata.name for p in core.list_namespaced_pod(ns).items},
               "the lowered pod preempted and deleted")
    wait_until(lambda: (wl := _wl_of(custom, ns, "interactive")) and admitted(wl), "the interactive run admitted")
    # the protected ones were not touched (a pod Kueue stops is deleted and never comes back)
    assert {p.metadata.name for p in core.list_namespaced_pod(ns).items} == {"s-0", "s-1", "s-3", "interactive"}
    assert all(not p.metadata.deletion_timestamp for p in core.list_namespaced_pod(ns).items)
    with pytest.raises(kubernetes.client.ApiException) as removed:
        core.patch_namespaced_pod("s-0", ns, {"metadata": {"labels": {"kueue.x-k8s.io/priority-class": None}}})
    assert removed.value.status == 422 and "cannot be removed from a workload" in removed.value.body
    # a pod still gated (suspended, waiting: the pool is full) may get a class
    core.create_namespaced_pod(ns, gpu_pod("waiting", "user-queue"))
    core.patch_namespaced_pod("waiting", ns, {"metadata": {"labels": {"kueue.x-k8s.io/priority-class": batch}}})


def test_a_preempted_job_goes_back_to_its_own_place_in_line_not_to_the_end(client, core, custom, pool):
    # Kueue orders a Workload preempted within its ClusterQueue by its creation time (GetQueueOrderTimestamp),
    # not by its requeue: once the quota frees, it goes ahead of an equal-priority Job queued after it
    for name, value in ((f"batch-{pool.name}", 100), (f"inter-{pool.name}", 1000)):
        create(custom, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": name},
                                                   "value": value})
    pool.queue(preemption={"withinClusterQueue": "LowerPriority"})
    ns = pool.users[0]
    batch = kubernetes.client.BatchV1Api(client)

    def job(name: str) -> None:
        batch.create_namespaced_job(ns, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": name, "labels": {"kueue.x-k8s.io/queue-name": "user-queue",
                                     "kueue.x-k8s.io/priority-class": f"batch-{pool.name}"}},
            "spec": {"template": {"spec": gpu_pod("x", "q", 2)["spec"]}}})

    for name in ("early", "side"):  # flavor a, then flavor b
        job(name)
        wait_until(lambda n=name: (w := _wl_of(custom, ns, n)) and admitted(w), f"{name} admitted")
    time.sleep(1.05 - time.time() % 1.0)  # a later second: creation times have whole seconds
    job("later")  # the pool is full: it waits
    wait_until(lambda: _wl_of(custom, ns, "later"), "later's Workload")
    time.sleep(1.05 - time.time() % 1.0)
    core.create_namespaced_pod(ns, gpu_pod("urgent", "user-queue", 2, priority=f"inter-{pool.name}"))
    wait_until(lambda: (w := _wl_of(custom, ns, "urgent")) and admitted(w), "the interactive pod admitted")
    early = _wl_of(custom, ns, "early")
    assert condition(early, "Preempted")["status"] == "True" and condition(early, "Requeued")["status"] == "True"
    assert not admitted(_wl_of(custom, ns, "later"))
    time.sleep(1.05 - time.time() % 1.0)
    core.delete_namespaced_pod("urgent", ns)  # flavor a frees: early was queued first
    first = wait_until(lambda: [n for n in ("early", "later") if admitted(_wl_of(custom, ns, n) or {})],
                       "a waiting Job admitted")
    assert first == ["early"], [(w["metadata"]["name"], w["status"].get("conditions")) for w in workloads(custom, ns)]
    assert not batch.read_namespaced_job("early", ns).spec.suspend and batch.read_namespaced_job("later", ns).spec.suspend
