"""A queued whole GPU in a pool with a memory isolator's donor. Kueue counts ``nvidia.com/gpu`` per flavor as the
flavor's nodes offer it, and an isolator's nodes offer it as slots (ten a GPU, HAMi's default), so a plain
``nvidia.com/gpu: 1`` admitted to the isolator's flavor would hold one slot and none of the GPU's memory. The
isolator is the cheapest donor here, so its flavor is the first Kueue tries. On the sandbox and on real Kueue
(tests/realcluster: donor-1 is a real node, the isolator a node with nothing behind it, as a virtual kubelet's):
the whole GPU is admitted to the whole-GPU donor's flavor and runs there; narrowed to the isolator, it asks one
slot and all of the GPU's memory, which Kueue counts against the isolator's ``nvidia.com/gpumem`` quota."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import KueueConfig
from ...realcluster.realorigin import RealOrigin
from .conftest import kueue_origin_on_each_cluster, settings
from .helpers import Sink
from .test_queueing import KUEUE, QUEUE, in_thread, workloads

DONORS = (liqo.Donor("donor-1", 1, "A100", "2.00"),
          liqo.Donor("hami", 1, "A100", "0.50", sharing="memory"))
WHOLE_FLAVOR, ISOLATOR_FLAVOR = "gpuo-donor-1-a100", "gpuo-hami-a100"
GPU_MIB = 80 * 1024
"""The seeded A100's memory in MiB: what one whole GPU of the isolator asks for."""


SANDBOX = KueueConfig(DONORS, KueueOptions(usage_sampling=36000.0))
# the isolator's node has nothing behind it, also on the stage's cluster with a second real kubelet
origin = kueue_origin_on_each_cluster(SANDBOX, real_nodes=1)


@pytest.fixture(scope="module")
def core(api_client: Any) -> Any:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture(scope="module")
def custom(api_client: Any) -> Any:
    return kubernetes.client.CustomObjectsApi(api_client)


def _admission(custom: Any, namespace: str) -> dict[str, Any] | None:
    """The one podset assignment of the namespace's admitted Workload, or None while none is admitted."""
    for workload in workloads(custom, namespace):
        admission = (workload.get("status") or {}).get("admission")
        if admission:
            return dict(admission["podSetAssignments"][0])
    return None


def test_the_isolators_flavor_counts_its_slots_and_its_memory(custom: Any, user_ns: str) -> None:
    queue = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", QUEUE)
    quotas = {f["name"]: {r["name"]: str(r["nominalQuota"]) for r in f["resources"]}
              for f in queue["spec"]["resourceGroups"][0]["flavors"]}
    assert [f["name"] for f in queue["spec"]["resourceGroups"][0]["flavors"]] == [ISOLATOR_FLAVOR, WHOLE_FLAVOR]
    assert (quotas[ISOLATOR_FLAVOR]["nvidia.com/gpu"], quotas[ISOLATOR_FLAVOR]["nvidia.com/gpumem"]) == (
        "10", str(GPU_MIB))
    assert (quotas[WHOLE_FLAVOR]["nvidia.com/gpu"], quotas[WHOLE_FLAVOR]["nvidia.com/gpumem"]) == ("1", "0")


def test_a_queued_whole_gpu_is_admitted_to_the_whole_gpu_donor_not_as_an_isolators_slot(
        api_client: Any, core: Any, custom: Any, user_ns: str) -> None:
    backend = KubernetesBackend(settings(user_ns, queue=QUEUE, priority="interactive"), api_client)
    try:
        sink, results = Sink(), dict[str, Any]()
        thread = in_thread(backend, "import os\nseen = os.environ.get('CUDA_DEVICE_MEMORY_LIMIT_0')", sink,
                           results, "whole")
        admitted = wait_until(lambda: _admission(custom, user_ns), "the whole GPU admitted", timeout=120)
        # before: Kueue tried the cheaper isolator's flavor first and admitted nvidia.com/gpu: 1 there, a slot
        assert admitted["flavors"]["nvidia.com/gpu"] == WHOLE_FLAVOR, admitted
        assert "nvidia.com/gpumem" not in admitted["resourceUsage"], admitted
        thread.join(180)
        outcome, _, run = results["whole"]
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert run.current.ctx.cluster == "donor-1"
    finally:
        backend.close()


def test_a_queued_whole_gpu_narrowed_to_the_isolator_asks_a_slot_and_all_its_memory(
        api_client: Any, core: Any, custom: Any, user_ns: str, origin: Any) -> None:
    backend = KubernetesBackend(settings(user_ns, queue=QUEUE, priority="interactive"), api_client)
    try:
        sink, results = Sink(), dict[str, Any]()
        thread = in_thread(backend, "import os\nseen = os.environ.get('CUDA_DEVICE_MEMORY_LIMIT_0')", sink,
                           results, "isolated", cluster="hami")
        admitted = wait_until(lambda: _admission(custom, user_ns), "the whole GPU admitted", timeout=120)
        assert admitted["flavors"]["nvidia.com/gpu"] == admitted["flavors"]["nvidia.com/gpumem"] == ISOLATOR_FLAVOR
        assert (admitted["resourceUsage"]["nvidia.com/gpu"], admitted["resourceUsage"]["nvidia.com/gpumem"]) == (
            "1", str(GPU_MIB)), admitted
        pod = core.list_namespaced_pod(user_ns).items[0]
        assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(GPU_MIB)}
        if isinstance(origin, RealOrigin):
            # the isolator's node has no kubelet behind it on the real cluster: admission is what Kueue decides
            core.delete_namespaced_pod(pod.metadata.name, user_ns, grace_period_seconds=0)
            thread.join(120)
            return
        thread.join(180)
        outcome, _, run = results["isolated"]
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert run.current.ctx.cluster == "hami"
        assert any("a whole GPU (memory: 1 nvidia.com/gpu, 81920 nvidia.com/gpumem; isolation: compute and memory)"
                   in n for n in sink.notices), sink.notices
    finally:
        backend.close()
