"""A donor that stops answering (its peering or virtual kubelet lost), on the sandbox and on a real cluster.

Kubernetes' node controller marks such a node unreachable after its grace period (50 s on a real cluster) and
its taint eviction then deletes each pod once the pod's toleration of the ``unreachable`` taint runs out: 300 s
for a pod that names none (DefaultTolerationSeconds). Runner pods tolerate it ``GPU_OFFLOAD_NODE_LOST_SECONDS``
(10 s by default, shorter here), so a run sent to a lost donor is retried elsewhere, or reported lost with what
arrived, about a minute after the donor went silent instead of six. The pod stays Terminating on the silent
node; the engine deletes it and leaves nothing behind.

On ``[real]`` the node's kubelet process is killed (its containers run on, as on a donor cut off) and started
again afterwards; on ``[sandbox]`` the ``node-not-ready`` fault does the same, with a grace of a few seconds
instead of 50. A session whose donor is lost resumes elsewhere from its checkpoint: test_session_survival.py."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import RemoteError

from .conftest import STOCK_IMAGE, donor_lost, leftovers, origin_on_each_cluster, settings
from .helpers import Sink, run_cell

LOST_SECONDS = 2
"""The runner pods' toleration of an unreachable node in these tests (the product's default is 10 s)."""
SANDBOX_GRACE = 5.0
"""The sandbox's node-monitor grace here: long enough for the first run to be placed and bound on the silent
node before it is marked unreachable, as the real cluster's 50 s are."""
SLOW_CELL = "import time\nprint('started', flush=True)\ntime.sleep(600)\nprint('never')"
Lose = Callable[[str], contextlib.AbstractContextManager[None]]


origin = origin_on_each_cluster()  # on [real], the same two donors, each a real kubelet's node


@pytest.fixture()
def lose(origin: Any) -> Lose:
    """The node of a donor stops answering for a block (its kubelet gone), and answers again after it."""
    return lambda node: donor_lost(origin, node, grace=SANDBOX_GRACE)


@pytest.fixture()
def kube(api_client: Any, namespace: str, core: Any) -> Iterator[KubernetesBackend]:
    """A backend whose pods tolerate an unreachable node ``LOST_SECONDS``; nothing of alice's is left after."""
    backend = KubernetesBackend(settings(namespace, node_lost_seconds=LOST_SECONDS), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=120)


def _node_tolerations(pod: Any) -> dict[str, int | None]:
    return {t.key: t.toleration_seconds for t in pod.spec.tolerations or [] if t.key.startswith("node.kubernetes.io/")}


def test_a_pod_that_tolerates_neither_node_taint_gets_kubernetes_300_seconds_of_each(core: Any, namespace: str,
                                                                                      origin: Any) -> None:
    pod = core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": STOCK_IMAGE, "command": ["true"]}]}})
    try:
        assert _node_tolerations(pod) == {"node.kubernetes.io/not-ready": 300, "node.kubernetes.io/unreachable": 300}
    finally:
        core.delete_namespaced_pod("plain", namespace, grace_period_seconds=0)


def test_a_run_sent_to_a_donor_that_stopped_answering_is_retried_elsewhere_once_kubernetes_evicts_it(
        kube: KubernetesBackend, lose: Lose) -> None:
    # donor-2 has the most free GPUs: placement sends the cell there while its node still looks Ready
    with lose("donor-2-gpu"):
        outcome, sink, run = run_cell(kube, "print('ran elsewhere')", {})
    assert outcome.status == "ok", outcome.error
    assert "ran elsewhere" in sink.text
    [retry] = [n for n in sink.notices if "retrying once on" in n]
    assert retry.startswith("warning: the virtual node of donor-2 was lost (donor-2-gpu stopped answering and "
                            "Kubernetes evicted the pod: Taint manager: deleting due to NoExecute taint)"), retry
    assert "before the cell started; retrying once on donor-1" in retry
    assert run.current.ctx.cluster == "donor-1"


def test_a_run_whose_donor_stops_answering_mid_cell_is_reported_lost_with_what_arrived(
        kube: KubernetesBackend, core: Any, namespace: str, lose: Lose) -> None:
    lost = threading.Event()
    block: list[contextlib.ExitStack] = []
    pods: list[Any] = []

    def on_line(text: str) -> None:
        if "started" in text and not lost.is_set():
            lost.set()
            pods.append(pod := core.list_namespaced_pod(namespace).items[0])
            stack = contextlib.ExitStack()
            stack.enter_context(lose(pod.spec.node_name))
            block.append(stack)

    try:
        outcome, sink, _ = run_cell(kube, SLOW_CELL, {}, Sink(on_line=on_line))
    finally:
        for stack in block:
            stack.close()
    assert block, "the cell never started"
    # the server kept the runner's own tolerations: no 300 s default was added beside them
    assert _node_tolerations(pods[0]) == {"node.kubernetes.io/not-ready": LOST_SECONDS,
                                          "node.kubernetes.io/unreachable": LOST_SECONDS}
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "VirtualNodeLost", outcome.error
    message = outcome.error.evalue
    node = pods[0].spec.node_name  # where placement sent it (the donor with more free GPUs, as the nodes report)
    assert f"the virtual node of {node.removesuffix('-gpu')} was lost ({node} stopped answering and Kubernetes " \
           "evicted" in message
    assert "after the cell had started: 1 line(s) of output arrived" in message
    assert "started" in sink.text and "never" not in sink.text
