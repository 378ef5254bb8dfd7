"""A queued cell whose pod Kueue admitted but that cannot start in time: real Kueue's ``waitForPodsReady`` evicts
and deletes the plain pod (it requeues only Jobs), and the kernel queues a new pod once through the retry every
unstarted failure gets; the new pod runs the cell. On the real cluster, with its 45 s PodsReady timeout.

The GPU Kueue's quota counts as free is taken by a pod Kueue does not manage (bound to the node directly, from a
namespace outside Kueue's selector), so the admitted pod waits Unschedulable until the eviction; the neighbour
ends once the eviction was reported.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ..engine.kube.conftest import STOCK_IMAGE, leftovers, settings
from ..engine.kube.helpers import Sink, run_cell
from ..sandbox.kueue_setup import synced_pool
from .realorigin import RealOrigin, seeded_origin

pytestmark = pytest.mark.real_cluster
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
TOLERATION = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def origin() -> Iterator[RealOrigin]:
    with seeded_origin((liqo.Donor("donor-1", 1, "A100", "2.00"),), SHARED / "liqo-crds") as real:
        yield real


@pytest.fixture()
def core(origin: RealOrigin) -> Iterator[Any]:
    with origin.sandbox.api_client() as client:
        yield kubernetes.client.CoreV1Api(client)


@pytest.fixture()
def pool(origin: RealOrigin, core: Any) -> str:
    name = f"jhub-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    synced_pool(origin.sandbox, name)
    return name


@pytest.fixture()
def neighbour(core: Any) -> Iterator[str]:
    """A pod of someone Kueue does not manage, holding donor-1-gpu's one GPU."""
    namespace = f"gpuo-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "neighbour"},
        "spec": {"nodeName": "donor-1-gpu", "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "c", "image": STOCK_IMAGE, "command": ["sleep", "600"],
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    wait_until(lambda: core.read_namespaced_pod("neighbour", namespace).status.phase == "Running",
               "the neighbour running", timeout=120, every=0.5)
    yield namespace
    core.delete_namespace(namespace, grace_period_seconds=0)


class Retrying(Sink):
    """Ends the neighbour once the kernel says it is queueing a new pod."""

    def __init__(self, then: Any) -> None:
        super().__init__()
        self.then = then

    def notice(self, text: str) -> None:
        super().notice(text)
        if "retrying once" in text:
            threading.Thread(target=self.then, daemon=True).start()


def test_a_pod_kueue_evicts_for_not_starting_in_time_is_queued_again_and_runs(
        origin: RealOrigin, core: Any, pool: str, neighbour: str) -> None:
    with origin.sandbox.api_client() as client:
        backend = KubernetesBackend(settings(pool, queue="gpu-offload", priority="interactive"), client)
        try:
            sink = Retrying(lambda: core.delete_namespaced_pod("neighbour", neighbour, grace_period_seconds=0))
            outcome, sink, run = run_cell(backend, "print('ran after the requeue')", {}, sink)
        finally:
            backend.close()
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert "ran after the requeue" in sink.text
        said = [n for n in sink.notices if "retrying once" in n]
        assert len(said) == 1, sink.notices
        assert said[0].startswith("warning: Kueue evicted the pod (PodsReadyTimeout: Exceeded the PodsReady timeout "
                                  f"{pool}/pod-gpuo-"), said
        assert said[0].endswith(" before the cell started; retrying once on the cluster Kueue picks"), said
        assert run.cluster == "donor-1"
        custom = kubernetes.client.CustomObjectsApi(client)
        wait_until(lambda: not leftovers(core, pool), "no pod or Secret left behind", timeout=60)
        wait_until(lambda: not custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", pool,
                                                                     "workloads")["items"],
                   "no Workload left behind", timeout=60)
