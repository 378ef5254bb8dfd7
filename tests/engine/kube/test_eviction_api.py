"""The Eviction API (``POST pods/<name>/eviction``, policy/v1), which ``kubectl drain`` uses to move pods off a node,
on the sandbox's API server and on real kube-apiserver 1.35 with its disruption controller (tests/realcluster):
the same requests get the same answers, word for word. A PodDisruptionBudget that allows no disruption refuses
with 429 and says how many healthy pods it needs and has; one that allows one lets the first eviction through
and refuses the next; an evicted pod gets the ``DisruptionTarget`` condition (reason ``EvictionByEvictionAPI``)
and is deleted with the grace period the Eviction asked; a missing pod is a 404, a body naming another pod a
400; a pod no budget covers is evicted at once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until

from ... import kubectl
from .conftest import DONORS, STOCK_IMAGE, origin_on_each_cluster

origin = origin_on_each_cluster()
NODE = DONORS[0].node_name
VIOLATES = "Cannot evict pod as it would violate the pod's disruption budget."


@pytest.fixture()
def ns(core: Any, custom: Any, namespace: str) -> Iterator[str]:
    """The test's namespace offloaded (a pod may go to a donor's node); afterwards no pod is left in it."""
    custom.create_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings",
        {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
         "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}})
    yield namespace
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(kubernetes.client.ApiException):  # an evicted pod may be gone since listed
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "no pod left", timeout=60)


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "held"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 60,
                     "nodeSelector": {"kubernetes.io/hostname": NODE},
                     "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                      "effect": "NoExecute"}],
                     "containers": [{"name": "c", "image": STOCK_IMAGE, "imagePullPolicy": "IfNotPresent",
                                     # it outlives SIGTERM, as a runner writing its checkpoint does: an
                                     # evicted pod stays in its grace period instead of going at once
                                     "command": ["python3", "-c", "import signal, time; "
                                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]}]}}


def _ready(core: Any, namespace: str, name: str) -> None:
    def ready() -> bool:
        pod = core.read_namespaced_pod(name, namespace)
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

    wait_until(ready, f"pod {name} Ready", timeout=120)


def _evict(core: Any, namespace: str, name: str, body_name: str | None = None,
           grace: int | None = None) -> tuple[int, dict[str, Any]]:
    """POST the Eviction; the HTTP status and the body the server answered."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": body_name or name, "namespace": namespace}}
    if grace is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace}
    try:
        answer = core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
        return answer.status, json.loads(answer.data)
    except kubernetes.client.ApiException as exc:
        return exc.status, json.loads(exc.body)


def _budget(policy: Any, namespace: str) -> dict[str, Any]:
    answer = policy.read_namespaced_pod_disruption_budget("held", namespace, _preload_content=False)
    return dict(json.loads(answer.data))


def _refused(healthy: int) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": VIOLATES,
            "reason": "TooManyRequests", "details": {"causes": [{"reason": "DisruptionBudget", "message":
            f"The disruption budget held needs 1 healthy pods and has {healthy} currently"}]}, "code": 429}


SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def test_a_disruption_budget_refuses_then_allows_one_eviction(core: Any, api_client: Any, ns: str) -> None:
    policy = kubernetes.client.PolicyV1Api(api_client)
    core.create_namespaced_pod(ns, _pod("a"))
    _ready(core, ns, "a")
    policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "held"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}}})
    wait_until(lambda: (_budget(policy, ns).get("status") or {}).get("observedGeneration") == 1,
               "the disruption controller's first status")
    status = _budget(policy, ns)["status"]
    assert (status["expectedPods"], status["currentHealthy"], status["desiredHealthy"],
            status["disruptionsAllowed"]) == (1, 1, 1, 0)
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]] == [
        ("DisruptionAllowed", "False", "InsufficientPods", "")]

    # the budget forbids: 429 in the real words, and the pod is untouched
    assert _evict(core, ns, "a") == (429, _refused(1))
    pod = core.read_namespaced_pod("a", ns)
    assert pod.metadata.deletion_timestamp is None
    assert "DisruptionTarget" not in [c.type for c in pod.status.conditions]

    # a second healthy pod: the budget allows one eviction, and only one
    core.create_namespaced_pod(ns, _pod("b"))
    _ready(core, ns, "b")
    wait_until(lambda: _budget(policy, ns)["status"].get("disruptionsAllowed") == 1, "one disruption allowed")
    assert _evict(core, ns, "a", grace=30) == (201, SUCCESS)
    pod = core.read_namespaced_pod("a", ns)
    assert pod.metadata.deletion_timestamp is not None and pod.metadata.deletion_grace_period_seconds == 30
    [target] = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert (target.status, target.reason, target.message) == ("True", "EvictionByEvictionAPI", "Eviction API: evicting")
    # the eviction took the one disruption at once; the controller then counts the pod being deleted as expected
    # but not healthy (it reads the pods on its own pace, so wait for it)
    status = wait_until(lambda: (s := _budget(policy, ns)["status"])["currentHealthy"] == 1 and s,
                        "the controller to count the evicted pod as not healthy")
    assert (status["expectedPods"], status["currentHealthy"], status["disruptionsAllowed"]) == (2, 1, 0)
    assert _evict(core, ns, "b") == (429, _refused(1))


def test_an_eviction_of_a_missing_pod_or_with_another_name_is_refused_and_no_budget_evicts_at_once(
        core: Any, ns: str) -> None:
    assert _evict(core, ns, "missing") == (404, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'pods "missing" not found', "reason": "NotFound", "details": {"name": "missing", "kind": "pods"},
        "code": 404})
    core.create_namespaced_pod(ns, _pod("free"))
    _ready(core, ns, "free")
    assert _evict(core, ns, "free", body_name="other") == (400, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "name in URL does not match name in Eviction object", "reason": "BadRequest", "code": 400})
    assert _evict(core, ns, "free", grace=0) == (201, SUCCESS)
    wait_until(lambda: not core.list_namespaced_pod(ns).items, "the evicted pod gone", timeout=60)


def test_discovery_lists_the_eviction_subresource_as_kubectl_drain_looks_for_it(api_client: Any) -> None:
    resources = kubernetes.client.CoreV1Api(api_client).get_api_resources().resources
    [eviction] = [r for r in resources if r.name == "pods/eviction"]
    assert (eviction.group, eviction.version, eviction.kind, eviction.verbs) == ("policy", "v1", "Eviction", ["create"])


@kubectl.needed
def test_kubectl_drain_evicts_through_the_eviction_api_and_kubectl_wait_follows(
        origin: Any, core: Any, api_client: Any, ns: str) -> None:
    """kubectl 1.35 as an admin runs it: ``wait`` (whose watch waits for the initial-events-end bookmark) and
    ``drain``, whose evictions a disruption budget refuses until it is gone."""
    config = origin.sandbox.kubeconfig
    policy = kubernetes.client.PolicyV1Api(api_client)
    core.create_namespaced_pod(ns, _pod("a"))
    assert kubectl.run(config, "wait", "-n", ns, "--for=condition=Ready", "pod/a", "--timeout=120s").stdout == \
        "pod/a condition met\n"
    policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "held"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}}})
    wait_until(lambda: (_budget(policy, ns).get("status") or {}).get("observedGeneration") == 1,
               "the disruption controller's first status")
    drain = ("drain", NODE, "--pod-selector=app=held", "--force", "--ignore-daemonsets", "--grace-period=1")
    # started first, so its watch is open well before the pod goes
    with kubectl.start(config, "wait", "-n", ns, "--for=delete", "pod/a", "--timeout=120s") as deleted:
        try:
            refused = kubectl.run(config, *drain, "--timeout=3s", check=False)
            assert refused.returncode == 1
            assert f"node/{NODE} cordoned\n" in refused.stdout
            assert (f'error when evicting pods/"a" -n "{ns}" (will retry after 5s): Cannot evict pod as it would '
                    "violate the pod's disruption budget.") in refused.stderr
            assert core.read_node(NODE).spec.unschedulable
            assert core.read_namespaced_pod("a", ns).metadata.deletion_timestamp is None

            policy.delete_namespaced_pod_disruption_budget("held", ns)
            drained = kubectl.run(config, *drain, "--timeout=120s")
            assert drained.stdout.endswith(f"evicting pod {ns}/a\npod/a evicted\nnode/{NODE} drained\n"), drained
            assert deleted.communicate(timeout=120) == ("pod/a condition met\n", "")
            assert deleted.returncode == 0
            with pytest.raises(kubernetes.client.ApiException) as gone:
                core.read_namespaced_pod("a", ns)
            assert gone.value.status == 404
        finally:
            kubectl.run(config, "uncordon", NODE)
    assert not core.read_node(NODE).spec.unschedulable
