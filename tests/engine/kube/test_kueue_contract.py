"""What the project relies on Kueue doing, on the sandbox's emulation and on real Kueue 0.19 (tests/realcluster):
its pod webhook's two gates and finalizer, the finalizers of Workloads and queues, the defaults Kueue's CRDs give
the queues ``gpu-offload queues sync`` writes, its webhooks failing closed while Kueue is down, and a tie within
one second broken by the Workloads' UIDs. The same test on both: a difference is a sandbox bug or a gap named in
docs/sandbox-kueue.md."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering import kueue as K
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.kueue.testing import running_kueue_origin

from gpu_offload.cli import main

from ...realcluster.realorigin import clusters, kueue_outage, seeded_origin
from .conftest import IMAGE_MAP, SHARED, STOCK_IMAGE, queued_user_namespace
from .test_queueing import DONORS, KUEUE, QUEUE, fill_pool, workloads

GATES = ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"]
IN_USE = "kueue.x-k8s.io/resource-in-use"
Outage = Callable[[], contextlib.AbstractContextManager[None]]
_OUTAGES: dict[int, Outage] = {}
MANAGED = {"matchLabels": {"gpu-offload.io/user-namespace": "true"}}
"""``managedJobsNamespaceSelector`` as docs/queueing.md has an admin set it (the real cluster's too)."""


@pytest.fixture(scope="module", params=clusters())
def origin(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if request.param == "real":
        with seeded_origin(DONORS, SHARED / "liqo-crds") as real:
            _OUTAGES[id(real)] = kueue_outage
            yield real
        return
    with running_kueue_origin(tmp_path_factory.mktemp("contract"), donors=DONORS,
                              crds=[SHARED / "liqo-crds", SHARED / "kueue-crds"], image_map=IMAGE_MAP,
                              kueue=KueueOptions(namespace_selector=MANAGED, usage_sampling=36000.0)
                              ) as (running, kueue):
        _OUTAGES[id(running)] = kueue.outage
        yield running


@pytest.fixture()
def outage(origin: Any) -> Outage:
    """Kueue down for a block: the sandbox's switch, or real Kueue's process killed and started again."""
    return _OUTAGES[id(origin)]


@pytest.fixture()
def user_ns(origin: Any, core: Any, custom: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user namespace with its LocalQueue, as the hub makes one; afterwards its pods and Workloads are gone."""
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    namespace = queued_user_namespace(core, custom)
    yield namespace
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "no pod left", timeout=60)
    wait_until(lambda: not workloads(custom, namespace), "no Workload left", timeout=60)
    core.delete_namespace(namespace)


def _pod(name: str, gpus: int, queue: str | None = QUEUE) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": STOCK_IMAGE, "command": ["python3", "-c", "import time; time.sleep(600)"],
                **K.queued_scheduling(gpus)}]}}


def _owner(workload: dict[str, Any]) -> str:
    return str(workload["metadata"]["ownerReferences"][0]["name"])


def _pending(api_client: Any, namespace: str) -> list[str]:
    """The owners of the LocalQueue's pending Workloads, head first, from Kueue's visibility API."""
    path = (f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/{QUEUE}"
            "/pendingworkloads")
    body = api_client.call_api(path, "GET", response_types_map={200: "object"}, auth_settings=["BearerToken"],
                               _return_http_data_only=True)
    return [str(i["metadata"]["ownerReferences"][0]["name"]) for i in body["items"]]


def test_a_queued_pod_gets_both_gates_and_kueues_finalizer_and_still_goes_once_deleted(
        core: Any, custom: Any, user_ns: str) -> None:
    pod = core.create_namespaced_pod(user_ns, _pod("gated", 5))  # more GPUs than the pool: it stays queued
    assert [g.name for g in pod.spec.scheduling_gates] == GATES
    assert pod.metadata.finalizers == ["kueue.x-k8s.io/managed"]
    (workload,) = wait_until(lambda: workloads(custom, user_ns), "the pod's Workload", timeout=60)
    assert workload["metadata"]["finalizers"] == [IN_USE]
    core.delete_namespaced_pod("gated", user_ns, grace_period_seconds=0)
    # Kueue lets go of its finalizers: the pod and its Workload do go
    wait_until(lambda: not core.list_namespaced_pod(user_ns).items, "the queued pod gone", timeout=60, every=0.2)
    wait_until(lambda: not workloads(custom, user_ns), "its Workload gone", timeout=60, every=0.2)


def test_kueues_crds_default_the_queues_sync_writes_and_a_second_sync_writes_nothing(
        custom: Any, user_ns: str) -> None:
    lq = custom.get_namespaced_custom_object(*KUEUE, user_ns, "localqueues", QUEUE)
    assert lq["spec"]["stopPolicy"] == "None"  # a default of the LocalQueue CRD: the sync never writes it
    cq = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", lq["spec"]["clusterQueue"])
    assert cq["metadata"]["finalizers"] == [IN_USE]
    assert cq["spec"]["stopPolicy"] == "None"
    assert cq["spec"]["flavorFungibility"] == {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}
    flavors = [f["name"] for g in cq["spec"]["resourceGroups"] for f in g["flavors"]]
    for name in flavors:
        assert custom.get_cluster_custom_object(*KUEUE, "resourceflavors", name)["metadata"]["finalizers"] == [IN_USE]
    before = {name: custom.get_cluster_custom_object(*KUEUE, "resourceflavors", name)["metadata"]["generation"]
              for name in flavors}
    assert main(["queues", "sync", "--namespace", user_ns]) == 0
    # the defaults the server added do not read as a difference: nothing is written again
    assert custom.get_namespaced_custom_object(*KUEUE, user_ns, "localqueues", QUEUE)["metadata"]["generation"] == \
        lq["metadata"]["generation"]
    again = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", cq["metadata"]["name"])
    assert again["metadata"]["generation"] == cq["metadata"]["generation"]
    assert {name: custom.get_cluster_custom_object(*KUEUE, "resourceflavors", name)["metadata"]["generation"]
            for name in flavors} == before


def test_while_kueue_is_down_pods_of_user_namespaces_are_refused_and_a_deleted_queued_pod_waits_for_it(
        core: Any, custom: Any, api_client: Any, user_ns: str, outage: Outage) -> None:
    core.create_namespaced_pod(user_ns, _pod("queued", 5))
    wait_until(lambda: workloads(custom, user_ns), "the queued pod's Workload", timeout=60)
    other = f"gpuo-test-{uuid.uuid4().hex[:8]}"  # a namespace Kueue does not manage
    core.create_namespace({"metadata": {"name": other}})
    try:
        with outage():
            for name, queue in (("refused", QUEUE), ("plain", None)):  # queued or not: the webhook sees every pod
                with pytest.raises(kubernetes.client.ApiException) as refused:
                    core.create_namespaced_pod(user_ns, _pod(name, 1, queue))
                assert refused.value.status == 500
                assert json.loads(refused.value.body)["message"].startswith(
                    'Internal error occurred: failed calling webhook "mpod.kb.io": failed to call webhook:')
            core.create_namespaced_pod(other, _pod("elsewhere", 1, None))  # outside its namespaces: no webhook
            with pytest.raises(kubernetes.client.ApiException) as unavailable:
                _pending(api_client, user_ns)
            assert unavailable.value.status == 503
            core.delete_namespaced_pod("queued", user_ns, grace_period_seconds=0)
            time.sleep(1)
            # nobody lets go of Kueue's finalizer: the pod stays, Terminating
            assert core.read_namespaced_pod("queued", user_ns).metadata.deletion_timestamp is not None
        wait_until(lambda: not core.list_namespaced_pod(user_ns).items, "the deleted pod gone once Kueue is back",
                   timeout=60, every=0.2)
        created = core.create_namespaced_pod(user_ns, _pod("after", 5))
        assert [g.name for g in created.spec.scheduling_gates] == GATES
    finally:
        core.delete_namespace(other)


def test_pods_queued_within_one_second_wait_in_the_order_of_their_workloads_uids(
        core: Any, custom: Any, api_client: Any, user_ns: str) -> None:
    fill_pool(core, user_ns)  # both GPUs held: the next pods wait
    names = [f"tie-{i}" for i in range(4)]
    for name in names:
        core.create_namespaced_pod(user_ns, _pod(name, 1))
    ours = wait_until(lambda: len(w := [x for x in workloads(custom, user_ns) if _owner(x) in names]) == 4 and w,
                      "the four Workloads", timeout=60)
    seconds = Counter(w["metadata"]["creationTimestamp"] for w in ours)
    assert max(seconds.values()) >= 2, f"no two Workloads created within one second: {seconds}"
    # Kueue's order: priority (equal), creation time in whole seconds, then the Workload's UID; not arrival
    expected = [_owner(w) for w in sorted(ours, key=lambda w: (w["metadata"]["creationTimestamp"],
                                                               w["metadata"]["uid"]))]
    assert wait_until(lambda: (p := _pending(api_client, user_ns)) and len(p) == 4 and p, "all four pending",
                      timeout=60) == expected
