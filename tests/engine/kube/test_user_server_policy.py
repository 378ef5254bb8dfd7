"""The chart's user-server admission policy inside the sandbox's admission chain, with queueing through Kueue.

The sandbox evaluates no ValidatingAdmissionPolicy itself, so this module registers the rendered policy as a
validating hook of the sandbox's API: after the mutating hooks (Kueue's pod webhook among them), as
kube-apiserver runs validating admission after mutating admission, and evaluated with cel-python. Every
request of the module stands for the user's server (the sandbox does not authenticate): the kernel's own
runner pods must pass, and a user's own pod that would skip Kueue's queue must be refused with the API
server's words.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import kubernetes
import pytest
from gpu_offload.sandbox.apiserver.admission import AdmissionRequest
from gpu_offload.sandbox.apiserver.errors import forbidden
from gpu_offload.sandbox.fixtures import pooled_as, wait_until
from gpu_offload.sandbox.kueue.pooled import kueue_origin_key
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.cli import main
from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import QUEUED
from .chart_roles import rendered_chart
from .conftest import STOCK_IMAGE, leftovers, settings
from .helpers import run_cell

QUEUE = "gpu-offload"
POLICY = "gpu-offload-user-servers"
VALUES = {"queueing": {"kueue": {"enabled": True, "localQueue": QUEUE}}}


def rendered_policy(folder: Path) -> dict[str, Any]:
    """The chart's user-server policy with queueing on, as Helm renders it."""
    docs = rendered_chart(folder, VALUES)
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == POLICY]
    return policy


def _true(expression: str, activation: dict[str, Any]) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate(
        {key: celpy.json_to_cel(value) for key, value in activation.items()})
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def install_policy(origin: Any, policy: dict[str, Any]) -> Any:
    """Judge every pod and Job write as the API server would judge the user's server's (failurePolicy Fail:
    a validation that is not true denies, with its message, as a 403); returns the hook, which removing takes the
    policy away again (as deleting it would)."""
    def judge(req: AdmissionRequest) -> None:
        resource = req.resource.plural
        activation = {
            "object": req.object, "oldObject": req.old_object, "params": None, "namespaceObject": None,
            "request": {"operation": req.operation, "namespace": req.namespace, "name": req.name,
                        "resource": {"group": req.resource.group, "version": "v1", "resource": resource},
                        "userInfo": {"username": f"system:serviceaccount:{req.namespace}:gpu-offload-user-server"}}}
        spec = policy["spec"]
        if not all(_true(c["expression"], activation) for c in spec["matchConditions"]):
            return
        for validation in spec["validations"]:
            if not _true(validation["expression"], activation):
                message = " ".join(str(validation.get("message") or "").split())
                raise forbidden(req.resource.group, resource, req.name,
                                f"{resource} {req.name!r} is forbidden: ValidatingAdmissionPolicy '{POLICY}' with "
                                f"binding '{POLICY}' denied request: {message}")

    for target in ("pods", "jobs.batch"):
        origin.sandbox.api.admission.add_validating(target, judge, ("CREATE",))
    return judge


POLICY_ORIGIN = QUEUED.with_donors((liqo.Donor("donor-1", 2, "A100", "2.00"), liqo.Donor("donor-2", 2, "L4", "0.80")))
pooled = POLICY_ORIGIN.fixture(name="pooled")  # the session's Kueue origin of default options, these donors peered


@pytest.fixture(scope="module")
@pooled_as(kueue_origin_key(**POLICY_ORIGIN.pool_options()))
def origin(pooled: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    judge = install_policy(pooled, rendered_policy(tmp_path_factory.mktemp("chart")))
    yield pooled
    pooled.sandbox.api.admission.remove(judge)  # the origin is shared: the policy goes with the module


@pytest.fixture()
def user_namespace(origin: Any, api_client: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A namespace as the hub makes one: offloaded, labelled for the ClusterQueue, with its LocalQueue."""
    core = kubernetes.client.CoreV1Api(api_client)
    name = f"jhub-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", name, "namespaceoffloadings", {
            "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}})
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    assert main(["queues", "sync", "--namespace", name]) == 0
    yield name
    core.delete_namespace(name)


def test_the_kernels_queued_cells_and_sessions_pass_the_policy(api_client: Any, user_namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    backend = KubernetesBackend(settings(user_namespace, queue=QUEUE), api_client)
    user_ns: dict[str, Any] = {}
    try:
        outcome, sink, _ = run_cell(backend, "y = 6 * 7", user_ns)
        assert outcome.error is None and outcome.status == "ok", sink
        for cell in ("kept = 41", "kept += 1"):
            outcome, sink, _ = run_cell(backend, cell, user_ns, session="train")
            assert outcome.error is None and outcome.status == "ok", sink
    finally:
        backend.close()
    assert (user_ns["y"], user_ns["kept"]) == (42, 42)
    wait_until(lambda: not leftovers(core, user_namespace), "the cell's pod and Secret gone")


def _own_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "c", "image": STOCK_IMAGE, "command": ["python3", "-c", "import time; time.sleep(60)"],
                "resources": {"limits": {"nvidia.com/gpu": "2"}}}], **spec}}


def test_a_users_own_pod_that_would_skip_the_queue_or_take_gpus_is_refused_and_nothing_is_created(
        api_client: Any, user_namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    # owned by a Job: Kueue's webhook leaves it to that Job's Workload, which does not exist
    owned = _own_pod("owned")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "nothing",
                                             "uid": str(uuid.uuid4())}]
    bound = _own_pod("bound", nodeName="liqo-donor-1-gpu")  # bound by its creator: past the scheduler
    ranked = _own_pod("ranked", priorityClassName="system-cluster-critical")  # Kueue would order it by this
    sneaky = _own_pod("sneaky")  # no GPU asked for, every GPU of the node through the runtime
    sneaky["spec"]["containers"][0].update(resources={}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    for pod, words in ((owned, "ownerReferences"), (bound, "spec.nodeName"), (ranked, "priorityClassName"),
                       (sneaky, "NVIDIA_VISIBLE_DEVICES")):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            core.create_namespaced_pod(user_namespace, pod)
        assert refused.value.status == 403, refused.value.body
        assert words in refused.value.body and f"ValidatingAdmissionPolicy '{POLICY}'" in refused.value.body
    assert core.list_namespaced_pod(user_namespace).items == []
