"""A mixed pool: one donor's flavor selects on its cluster id and GPU model, the other's on its cluster id alone
(its nodes carry no model label, so ``gpu-offload queues sync`` writes ``gpuo-<id>-any``; a model the admin sets
for a cluster does the same). Kueue 0.19 checks each flavor on the keys of its own ``nodeLabels`` only, so a
request for a model must also name the clusters having it, or Kueue would admit it to the cluster-only flavor
where the scheduler finds no such node. On the sandbox and on real Kueue (tests/realcluster, a real node per
donor): an A100 cell waits for the A100 donor while the other flavor has room, and says why in Kueue's words;
a cell that names no model is admitted to the cluster-only flavor and runs there."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import KueueConfig
from .conftest import STOCK_IMAGE, kueue_origin_on_each_cluster, leftovers, settings
from .helpers import Sink
from .test_queueing import KUEUE, QUEUE, in_thread, workloads

DONORS = (liqo.Donor("donor-1", 1, "A100", "2.00"), liqo.Donor("donor-2", 1, "", "0.80"))
"""donor-2's node carries no GPU model label."""
MODEL_FLAVOR, CLUSTER_FLAVOR = "gpuo-donor-1-a100", "gpuo-donor-2-any"


origin = kueue_origin_on_each_cluster(KueueConfig(DONORS, KueueOptions(usage_sampling=36000.0)))


@pytest.fixture(scope="module")
def core(api_client: Any) -> Any:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture(scope="module")
def custom(api_client: Any) -> Any:
    return kubernetes.client.CustomObjectsApi(api_client)


def _hold_donor_1(core: Any, namespace: str) -> None:
    """A pod that queues through Kueue for donor-1's one GPU (pinned by cluster id) and sleeps until deleted."""
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "holder", "labels": {"kueue.x-k8s.io/queue-name": QUEUE,
                                                  "kueue.x-k8s.io/priority-class": "interactive"}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": STOCK_IMAGE, "command": ["python3", "-c", "import time; time.sleep(600)"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In",
                                       "values": ["donor-1"]}]}]}}}}})
    pod = wait_until(lambda: (p := core.read_namespaced_pod("holder", namespace)).status.phase == "Running" and p,
                     "the holder running", timeout=120)
    assert pod.spec.node_name == "donor-1-gpu"


def _pending_message(custom: Any, namespace: str, pod_prefix: str) -> str:
    for workload in workloads(custom, namespace):
        if workload["metadata"]["ownerReferences"][0]["name"].startswith(pod_prefix):
            for cond in (workload.get("status") or {}).get("conditions") or []:
                if cond["type"] == "QuotaReserved" and cond["status"] == "False":
                    return str(cond["message"])
    return ""


def test_the_pool_has_a_flavor_per_donor_one_on_its_cluster_id_alone(custom: Any, user_ns: str) -> None:
    labels = {name: custom.get_cluster_custom_object(*KUEUE, "resourceflavors", name)["spec"]["nodeLabels"]
              for name in (MODEL_FLAVOR, CLUSTER_FLAVOR)}
    assert labels == {MODEL_FLAVOR: {"liqo.io/remote-cluster-id": "donor-1", "gpu-offload.io/gpu-model": "A100"},
                      CLUSTER_FLAVOR: {"liqo.io/remote-cluster-id": "donor-2"}}


def test_a_model_request_waits_for_its_donor_while_the_cluster_only_flavor_has_room_and_a_plain_one_runs_there(
        api_client: Any, core: Any, custom: Any, user_ns: str) -> None:
    _hold_donor_1(core, user_ns)
    backend = KubernetesBackend(settings(user_ns, queue=QUEUE, priority="interactive"), api_client)
    try:
        a100, results = Sink(), dict[str, Any]()
        waiting = in_thread(backend, "print('on the A100')", a100, results, "a100", gpu_model="A100")
        wait_until(lambda: "a100" in results or any(n.startswith("queued for 1 x A100: ") for n in a100.notices),
                   "the A100 cell in line", timeout=120)
        assert "a100" not in results, results
        # Kueue 0.19 checked the cluster-only flavor on its own key, the cluster id, which the request names
        message = wait_until(lambda: _pending_message(custom, user_ns, "gpuo-"), "Kueue's reason", timeout=60)
        assert message == (f"couldn't assign flavors to pod set main: flavor {CLUSTER_FLAVOR} doesn't match node "
                           f"affinity, insufficient unused quota for nvidia.com/gpu in flavor {MODEL_FLAVOR}, 1 more "
                           "needed"), message
        plain = Sink()
        in_thread(backend, "print('anywhere')", plain, results, "plain").join(180)
        outcome, _, run = results["plain"]
        assert outcome.status == "ok", outcome.error
        assert "anywhere" in plain.text and run.current.ctx.cluster == "donor-2"
        assert "a100" not in results  # still waiting for donor-1, the cluster-only flavor's room notwithstanding
        core.delete_namespaced_pod("holder", user_ns, grace_period_seconds=0)
        waiting.join(180)
        outcome, _, run = results["a100"]
        assert outcome.status == "ok", outcome.error
        assert "on the A100" in a100.text and run.current.ctx.cluster == "donor-1"
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, user_ns), "nothing of alice's left", timeout=60)
