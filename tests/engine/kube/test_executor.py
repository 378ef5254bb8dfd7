"""The kube backend's executor on the sandbox: a launch plan's objects are created in order, each owned one
by its owner, and a step that fails half-way leaves nothing behind (no Pod, Job, its pods, Secret, Service
or stored bundle), with the step's own error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.errors import APIError
from gpu_offload.liqo_peering.specs import MAX_SECRET_BYTES
from gpu_offload.liqo_peering.trust import TrustPolicy
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload import images
from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.config import KubeSettings, StorageSettings
from gpu_offload.engine.backends.kube.executor import Executor
from gpu_offload.engine.backends.kube.plan import LaunchPlan, PodOrder, Situation, plan_launch
from gpu_offload.engine.backends.kube.pods import PodApi
from gpu_offload.engine.backends.kube.storage import RunStorage

from .conftest import BUCKET, settings
from .test_distributed import everything_left

RUNNER = b"not a runner: these pods are deleted before they could start one"
POLICY = TrustPolicy()


@pytest.fixture()
def faults(origin: Any) -> Iterator[Any]:
    yield origin.faults
    origin.faults.clear()


def plan_for(kube: KubeSettings, liqo: LiqoClient, request: RunRequest, bundle: bytes = b"bundle",
             offloaded: frozenset[str] = frozenset()) -> LaunchPlan:
    run_id = f"x{uuid.uuid4().hex[:8]}"
    seen = Situation(queue=None, kernel=images.kernel_versions(), manifest=images.manifest(), runner_size=len(RUNNER),
                     inventory=liqo.read_inventory(), offloaded=offloaded)
    return plan_launch(PodOrder(run_id, "nonce", request, bundle, bundle_run=run_id), frozenset(), kube, POLICY, seen)


def offloaded(api_client: Any, namespace: str) -> bool:
    g = L.NAMESPACE_OFFLOADING
    found = kubernetes.client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        g.group, g.version, namespace, g.plural)
    return bool(found["items"])


def test_the_plans_objects_are_created_in_order_each_owned_by_the_first(api_client: Any, namespace: str,
                                                                         core: Any) -> None:
    kube = settings(namespace)
    liqo = LiqoClient(api_client, trust=POLICY)
    executor = Executor(kube, PodApi(api_client, namespace), liqo, None)
    plan = plan_for(kube, liqo, RunRequest(gpus=1))
    assert plan.offloading is not None and not offloaded(api_client, namespace)
    created = executor.execute(plan, b"bundle", RUNNER)
    try:
        assert offloaded(api_client, namespace) and executor.offloaded == frozenset(plan.clusters)
        assert created.owner["kind"] == "Pod" and created.stdin == b"bundle"  # the bundle goes on stdin
        secret = core.read_namespaced_secret(f"{created.name}-runner", namespace)
        assert [(o.kind, o.name, o.uid) for o in secret.metadata.owner_references] == [
            ("Pod", created.name, created.owner["metadata"]["uid"])]
        pod = core.read_namespaced_pod(created.name, namespace)
        assert pod.spec.containers[0].image == plan.pod.image
    finally:
        core.delete_namespaced_pod(created.name, namespace, grace_period_seconds=0)  # its Secret goes with it
        wait_until(lambda: everything_left(api_client, namespace) == [], "the pod and its Secret gone", timeout=60)
    # the next plan knows the namespace is offloaded there and does not ask again
    again = plan_for(kube, liqo, RunRequest(gpus=1), offloaded=executor.offloaded)
    assert again.clusters == plan.clusters and again.offloading is None


@pytest.mark.parametrize(("request_", "failing", "created_before"), [
    (RunRequest(gpus=1), "secrets", "the Pod"),
    (RunRequest(gpus=1, image="python:3.11-slim", ranks=Ranks(nodes=2, procs_per_node=1)), "secrets", "the Job"),
    (RunRequest(gpus=1, image="python:3.11-slim", ranks=Ranks(nodes=2, procs_per_node=1)), "services",
     "the Job and its Secret"),
], ids=["pod-then-secret", "job-then-secret", "job-secret-then-service"])
def test_a_step_that_fails_half_way_leaves_nothing_behind(
        api_client: Any, namespace: str, faults: Any, request_: RunRequest, failing: str, created_before: str) -> None:
    kube = settings(namespace)
    liqo = LiqoClient(api_client, trust=POLICY)
    executor = Executor(kube, PodApi(api_client, namespace), liqo, None)
    plan = plan_for(kube, liqo, request_)
    rule = faults.api_error(rf"/namespaces/{namespace}/{failing}$", status=422, methods=("POST",),
                            message=f"refused for the test after {created_before} was created")
    with pytest.raises(APIError, match="refused for the test"):
        executor.execute(plan, b"bundle", RUNNER)
    assert faults.api.faults.fired(rule) == 1  # the failure did happen where the row says
    wait_until(lambda: everything_left(api_client, namespace) == [], "nothing of the launch left", timeout=60)


def test_a_stored_bundle_goes_when_the_launch_fails(api_client: Any, namespace: str, faults: Any, s3: Any,
                                                    s3_endpoint: str) -> None:
    kube = settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint))
    liqo = LiqoClient(api_client, trust=POLICY)
    storage = RunStorage(StorageSettings(BUCKET, s3_endpoint), kube.user)
    executor = Executor(kube, PodApi(api_client, namespace), liqo, storage)
    plan = plan_for(kube, liqo, RunRequest(gpus=1), bundle=b"x" * MAX_SECRET_BYTES)
    assert plan.stored
    faults.api_error(rf"/namespaces/{namespace}/pods$", status=422, methods=("POST",), message="refused for the test")
    with pytest.raises(APIError, match="refused for the test"):
        executor.execute(plan, b"x" * MAX_SECRET_BYTES, RUNNER)
    prefix = storage.key(plan.run_id, "x")[:-1]
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("KeyCount") == 0
    assert everything_left(api_client, namespace) == []
