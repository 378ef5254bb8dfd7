"""Real Liqo between the origin and donor of ``liqo.sh``: what it reflects to a donor, judged against the
sandbox's emulation of it (``gpu_offload.sandbox.liqo``) and the project's own checks.

- A pod of the project's shape goes through Liqo's virtual node to the donor's kubelet; its log comes back.
- Kueue's queue-name label: Liqo reflects every label of an offloaded pod unless the origin's Liqo lists it in
  ``offloading.reflection.skip.labels`` (the VirtualNode's ``offloadingPatch.labelsNotReflected``); a donor
  whose Kueue manages the namespace then gates the pod.
- Secrets and ConfigMaps of an offloaded namespace reach the donor exactly as the sandbox's
  ``reflection.reflected`` predicts, whatever the namespace's pod offloading strategy.
"""

from __future__ import annotations

import base64
import contextlib
import uuid
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering.specs import gpu_resource_slice
from gpu_offload.sandbox.liqo import offloading, reflection, slices
from gpu_offload.sandbox.liqo.seed import REMOTE_CLUSTER_ID_LABEL, TYPE_LABEL, VIRTUAL_NODE_TAINT

from gpu_offload.cli import doctor

from ..cli.helpers import cli, environment
from .liqopair import (
    DONOR_ID,
    IMAGE,
    ORIGIN_ID,
    ORIGIN_STATE,
    Pair,
    gpu_pod,
    offloaded_namespace,
    offloading_spec,
    pair,
    plain_namespace,
    plain_pod,
    virtual_node,
    wait,
)

pytestmark = [pytest.mark.real_liqo, pytest.mark.e2e]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture(scope="module")
def liqo() -> Any:
    with pair() as p:
        yield p


def test_virtual_node_is_as_the_sandbox_seeds_it(liqo: Pair) -> None:
    """The labels and taint the sandbox's seeded virtual nodes carry (and the project's placement relies on)
    are the ones real Liqo puts on the node it creates; its GPUs are the ResourceSlice's."""
    node = virtual_node(liqo)
    labels = node["metadata"]["labels"]
    assert labels[TYPE_LABEL] == "virtual-node"
    assert labels[REMOTE_CLUSTER_ID_LABEL] == DONOR_ID
    assert {"key": VIRTUAL_NODE_TAINT["key"], "value": VIRTUAL_NODE_TAINT["value"], "effect": VIRTUAL_NODE_TAINT["effect"]} \
        in [{k: t.get(k) for k in ("key", "value", "effect")} for t in node["spec"]["taints"]]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"


def _donor_pods(liqo: Pair, namespace: str, name: str) -> list[Any]:
    return [p for p in liqo.core("donor").list_namespaced_pod(namespace).items if p.metadata.name == name]


def test_pod_runs_on_the_donor_through_the_virtual_node(liqo: Pair) -> None:
    """A GPU pod on the origin is bound to the virtual node, runs in a real container on the donor's kubelet,
    and its log reaches the origin through the virtual kubelet."""
    with offloaded_namespace(liqo) as (namespace, twin):
        pod = gpu_pod("cell", "import os; print('on donor', os.environ.get('NVIDIA_VISIBLE_DEVICES'))")
        liqo.core("origin").create_namespaced_pod(namespace, pod)
        remote = _twin(liqo, namespace, twin, "cell")
        origin = wait(lambda: _phase(liqo, namespace, "cell", "Succeeded"), "the pod Succeeded on the origin", 240)
        assert origin.spec.node_name == virtual_node(liqo)["metadata"]["name"]
        assert remote.spec.node_name is None or remote.spec.node_name == "donor-gpu"
        log = liqo.core("origin").read_namespaced_pod_log("cell", namespace, _preload_content=False).data.decode()
        assert log.startswith("on donor ")
        assert log.split()[-1] != "None", "the donor's kubelet gave the container a GPU"


def _twin(liqo: Pair, namespace: str, twin: str, name: str) -> Any:
    """The donor's copy of the origin's pod ``name``; if it never comes, the failure says where the origin's pod
    is (scheduled or not, on which node, its conditions) and what the origin's events say of it."""
    try:
        return wait(lambda: _donor_pods(liqo, twin, name), "the pod's twin on the donor")[0]
    except AssertionError as exc:
        core = liqo.core("origin")
        pod = core.read_namespaced_pod(name, namespace)
        events = [f"{e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items
                  if e.involved_object.name == name]
        conditions = [(c.type, c.status, c.reason, c.message) for c in pod.status.conditions or []]
        raise AssertionError(f"{exc}; on the origin the pod is {pod.status.phase} on node {pod.spec.node_name}, "
                             f"conditions {conditions}, events {events}") from exc


def _phase(liqo: Pair, namespace: str, name: str, phase: str) -> Any:
    pod = liqo.core("origin").read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == phase else None


def test_kueue_queue_label_reaches_the_donor_and_its_kueue_gates_the_pod(liqo: Pair) -> None:
    """With Liqo's default reflection (no label skipped), the origin's queue-name label is copied to the
    donor's pod, and the donor's own Kueue (managing every namespace, its default) gates it: it never runs
    there, since the donor has no such LocalQueue."""
    skipped = virtual_node_skips(liqo)
    if QUEUE_LABEL in skipped:
        pytest.skip("this pair's origin keeps Kueue's label off donor pods; the next test covers it")
    with offloaded_namespace(liqo) as (namespace, twin):
        # A pod the origin's Kueue does not manage (the namespace is not a user namespace there): only the
        # donor's Kueue can act on the label.
        pod = gpu_pod("queued", "print('ran')", labels={QUEUE_LABEL: "user-queue"})
        liqo.core("origin").create_namespaced_pod(namespace, pod)
        remote = _twin(liqo, namespace, twin, "queued")
        assert remote.metadata.labels.get(QUEUE_LABEL) == "user-queue"
        assert doctor.unreflected_kueue_labels(_virtual_nodes(liqo)) == [DONOR_ID], "doctor names the node"
        gates = [g.name for g in remote.spec.scheduling_gates or []]
        assert "kueue.x-k8s.io/admission" in gates, f"the donor's Kueue did not gate the pod: {gates}"
        assert liqo.core("origin").read_namespaced_pod("queued", namespace).status.phase == "Pending"


def test_kueue_queue_label_kept_off_donor_pods_when_liqo_skips_it(liqo: Pair) -> None:
    """With ``kueue.x-k8s.io/queue-name`` in Liqo's labels not reflected (what docs/hub.md tells the admin and
    ``gpu-offload doctor`` checks), the donor's pod lacks the label and runs."""
    if QUEUE_LABEL not in virtual_node_skips(liqo):
        pytest.skip("this pair's origin reflects every label (Liqo's default); liqo.sh test runs this test again "
                    f"after keeping {QUEUE_LABEL} off donor pods")
    with offloaded_namespace(liqo) as (namespace, twin):
        pod = gpu_pod("queued", "print('ran')", labels={QUEUE_LABEL: "user-queue"})
        liqo.core("origin").create_namespaced_pod(namespace, pod)
        remote = _twin(liqo, namespace, twin, "queued")
        assert QUEUE_LABEL not in (remote.metadata.labels or {})
        assert doctor.unreflected_kueue_labels(_virtual_nodes(liqo)) == [], "doctor finds nothing to warn of"
        wait(lambda: _phase(liqo, namespace, "queued", "Succeeded"), "the pod Succeeded", 240)


def _virtual_nodes(liqo: Pair) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = liqo.custom("origin").list_cluster_custom_object(
        "offloading.liqo.io", "v1beta1", "virtualnodes")["items"]
    return items


def virtual_node_skips(liqo: Pair) -> list[str]:
    """The labels the origin's Liqo keeps off the donor's pods (the VirtualNode's offloading patch, filled
    from the VkOptionsTemplate when Liqo made it)."""
    (vn,) = _virtual_nodes(liqo)
    return list(((vn.get("spec") or {}).get("offloadingPatch") or {}).get("labelsNotReflected") or [])


def _objects(name: str) -> list[tuple[str, dict[str, Any]]]:
    """Secrets and ConfigMaps of every shape the reflection rules tell apart."""
    data = {"k": base64.b64encode(b"secret").decode()}
    return [
        ("Secret", {"metadata": {"name": f"{name}-plain"}, "data": data}),
        ("Secret", {"metadata": {"name": f"{name}-skipped", "annotations": {reflection.SKIP: "true"}}, "data": data}),
        ("Secret", {"metadata": {"name": f"{name}-skip-false", "annotations": {reflection.SKIP: "False"}},
                    "data": data}),
        ("Secret", {"metadata": {"name": f"{name}-allowed", "annotations": {reflection.ALLOW: "true"}}, "data": data}),
        ("ConfigMap", {"metadata": {"name": f"{name}-cm"}, "data": {"k": "v"}}),
        ("ConfigMap", {"metadata": {"name": f"{name}-cm-skipped", "annotations": {reflection.SKIP: "yes"}},
                       "data": {"k": "v"}}),
    ]


@pytest.mark.parametrize("strategy", ["Remote", "Local"])
def test_secrets_and_configmaps_reach_the_donor_as_the_sandbox_predicts(liqo: Pair, strategy: str) -> None:
    """Each Secret and ConfigMap of an offloaded namespace is on the donor exactly when the sandbox's rules
    (DenyList, Liqo's default) say Liqo copies it, with strategy Local too (the project offloads user
    namespaces with Local); the origin's kube-root-ca.crt arrives under the sandbox's remote name."""
    with offloaded_namespace(liqo, strategy) as (namespace, twin):
        objects = _objects("u" + uuid.uuid4().hex[:4])
        core = liqo.core("origin")
        for kind, obj in objects:
            create = core.create_namespaced_secret if kind == "Secret" else core.create_namespaced_config_map
            create(namespace, obj)
        expected = {obj["metadata"]["name"] for kind, obj in objects if reflection.reflected(obj, kind)}
        assert expected, "the objects include some Liqo copies"
        names = {obj["metadata"]["name"] for _, obj in objects}

        def donor_holds() -> set[str] | None:
            held = _donor_names(liqo, twin) & names
            return held if held >= expected else None
        wait(donor_holds, f"the donor's copies of {sorted(expected)}")
        # Copies arrive within a second or so; what is not there after the expected ones arrived and a grace
        # period is not coming.
        with contextlib.suppress(AssertionError):
            wait(lambda: (_donor_names(liqo, twin) & names) - expected or None, "an unexpected copy", 10)
        assert _donor_names(liqo, twin) & names == expected
        # the sandbox's rule for the origin's CA bundle: its name and the first 5 characters of the origin's id
        assert f"{reflection.ROOT_CA}.{ORIGIN_ID[:5]}" in _donor_names(liqo, twin)


def _donor_names(liqo: Pair, namespace: str) -> set[str]:
    core = liqo.core("donor")
    try:
        secrets = core.list_namespaced_secret(namespace).items
        configmaps = core.list_namespaced_config_map(namespace).items
    except kubernetes.client.ApiException:
        return set()
    return {o.metadata.name for o in [*secrets, *configmaps]}


def test_gpu_offload_run_goes_through_liqos_virtual_node_to_the_donor(liqo: Pair, tmp_path: Path) -> None:
    """The project's own path on real Liqo: `gpu-offload run` on the origin places its pod on the virtual node
    Liqo made, sends the bundle through the virtual kubelet's attach, and prints what ran on the donor's
    kubelet (a fake GPU allocated); nothing is left behind on the origin."""
    (tmp_path / "main.py").write_text("import os\nprint('ran with', os.environ.get('NVIDIA_VISIBLE_DEVICES'))\n")
    with offloaded_namespace(liqo, "Local") as (namespace, _twin):
        env = environment(tmp_path / "state", KUBECONFIG=str(ORIGIN_STATE / "admin.kubeconfig"),
                          GPU_OFFLOAD_NAMESPACE=namespace, GPU_OFFLOAD_IMAGE=IMAGE, JUPYTERHUB_USER="alice")
        done = cli(["run", "--gpus", "1", "main.py"], tmp_path, env, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("ran with fake-gpu-"), done.stdout
        assert f"on virtual node {virtual_node(liqo)['metadata']['name']} (Liqo cluster {DONOR_ID}" in done.stderr
        core = liqo.core("origin")
        wait(lambda: not core.list_namespaced_pod(namespace).items, "the run's pod gone", 60)
        assert not [s.metadata.name for s in core.list_namespaced_secret(namespace).items
                    if (s.metadata.labels or {}).get("gpu-offload.io/managed-by") == "gpu-offload"]


def _virtual_tolerations(spec: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(t.get("key"), t.get("operator"), t.get("value"), t.get("effect")) for t in spec.get("tolerations") or []
            if str(t.get("key", "")).startswith("virtual-node.liqo.io/")]


def _required_terms(spec: dict[str, Any]) -> list[Any]:
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
    return list((affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])


@pytest.mark.parametrize("strategy", ["Remote", "LocalAndRemote", "Local"])
def test_liqos_pod_webhook_changes_a_plain_pod_as_the_sandbox_predicts(liqo: Pair, strategy: str) -> None:
    """A plain pod (no GPU, toleration or affinity) created in an offloaded namespace gets from Liqo's webhook
    exactly the virtual-node toleration and required node affinity the sandbox's ``offloading.mutate_pod``
    gives it; with Local (how the project offloads user namespaces) nothing: it runs on the origin's own node
    and no twin of it appears on the donor."""
    with offloaded_namespace(liqo, strategy) as (namespace, twin):
        pod = plain_pod("plain")
        created = liqo.origin.sanitize_for_serialization(liqo.core("origin").create_namespaced_pod(namespace, pod))
        expected = offloading.mutate_pod(pod, offloading_spec(strategy))["spec"]
        assert _virtual_tolerations(created["spec"]) == _virtual_tolerations(expected)
        assert _required_terms(created["spec"]) == _required_terms(expected)
        assert twin == offloading.remote_namespace_name(namespace, offloading_spec(strategy))
        if strategy == "Local":
            done = wait(lambda: _phase(liqo, namespace, "plain", "Succeeded"), "the plain pod Succeeded", 240)
            assert done.spec.node_name == "origin"
            assert not _donor_pods(liqo, twin, "plain"), "a plain pod of a Local namespace reached the donor"


def test_a_pod_aimed_at_the_virtual_node_from_a_namespace_not_offloaded_stays_pending_as_the_sandbox_says(
        liqo: Pair) -> None:
    """A pod that tolerates the virtual node and names the donor, in a namespace nobody offloaded, is bound to
    the virtual node but never started: Pending with the reason the sandbox gives (its kubelet gate)."""
    with plain_namespace(liqo) as namespace:
        liqo.core("origin").create_namespaced_pod(namespace, gpu_pod("stuck", "print('ran')"))
        pod = wait(lambda: (p := liqo.core("origin").read_namespaced_pod("stuck", namespace)).status.reason and p,
                   "a reason on the pod", 120)
        assert pod.spec.node_name == virtual_node(liqo)["metadata"]["name"]
        assert (pod.status.phase, pod.status.reason) == ("Pending", offloading.OFFLOADING_BACKOFF), pod.status
        assert pod.status.container_statuses is None


TENANT = f"liqo-tenant-{DONOR_ID}"
RS = ("authentication.liqo.io", "v1beta1")


def _slices(tag: str) -> dict[str, dict[str, Any]]:
    """The project's GPU slice (what the hub admin's "request GPUs" writes) and three that each lack one thing
    real Liqo requires, by name."""
    built = gpu_resource_slice(f"gpuo-{tag}", TENANT, ORIGIN_ID, DONOR_ID, 1, cpu="1", memory="1Gi")

    def lacking(name: str, drop_label: str | None = None, drop_annotation: bool = False,
                provider: str = DONOR_ID) -> dict[str, Any]:
        body = gpu_resource_slice(name, TENANT, ORIGIN_ID, provider, 1)
        if drop_label:
            del body["metadata"]["labels"][drop_label]
        if drop_annotation:
            del body["metadata"]["annotations"]
        return body
    return {s["metadata"]["name"]: s for s in [
        built,
        lacking(f"gpuo-{tag}-unsent", drop_label="liqo.io/replication"),
        lacking(f"gpuo-{tag}-nonode", drop_annotation=True),
        lacking(f"gpuo-{tag}-nobody", provider="nobody"),
    ]}


def _slice_status(liqo: Pair, name: str) -> dict[str, Any]:
    obj = liqo.custom("origin").get_namespaced_custom_object(*RS, TENANT, "resourceslices", name)
    return dict(obj.get("status") or {})


def _accepted(status: dict[str, Any]) -> bool:
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return conditions.get("Authentication") == "Accepted" and conditions.get("Resources") == "Accepted"


def _named_nodes(liqo: Pair, names: set[str]) -> dict[str, Any]:
    return {n.metadata.name: n for n in liqo.core("origin").list_node().items if n.metadata.name in names}


def test_gpu_slices_get_a_virtual_node_exactly_as_the_sandbox_predicts(liqo: Pair) -> None:
    """The hub's GPU ResourceSlice (``liqo_peering.specs.gpu_resource_slice``) is granted by the donor and gets
    a virtual node of its own with the GPUs asked for; slices lacking what Liqo requires get what the sandbox's
    ``slices.sent_to``/``makes_virtual_node`` predict: not labelled for replication, no answer at all; no
    create-virtual-node annotation, granted but no node; a cluster nobody peered, no answer. All removed after,
    with their nodes (Liqo's slice owns its VirtualNode)."""
    bodies = _slices(uuid.uuid4().hex[:4])
    built = next(iter(bodies))
    custom = liqo.custom("origin")
    try:
        for body in bodies.values():
            custom.create_namespaced_custom_object(*RS, TENANT, "resourceslices", body)
        node = wait(lambda: (n := _named_nodes(liqo, {built}).get(built)) and
                    (n.status.allocatable or {}).get("nvidia.com/gpu") == "1" and n, f"a virtual node for {built}", 240)
        assert node.metadata.labels[TYPE_LABEL] == "virtual-node"
        assert node.metadata.labels[REMOTE_CLUSTER_ID_LABEL] == DONOR_ID
        sent = {n for n, b in bodies.items() if slices.sent_to(b) == DONOR_ID}
        wait(lambda: all(_accepted(_slice_status(liqo, n)) for n in sent) or None, f"the donor's grant of {sorted(sent)}")
        # an answer to the others would come within the same seconds; after a grace period none is coming
        with contextlib.suppress(AssertionError):
            wait(lambda: [n for n in bodies if n not in sent and _slice_status(liqo, n)] or None, "an unexpected answer", 15)
        nodes = _named_nodes(liqo, set(bodies))
        for name, body in bodies.items():
            if name not in sent:
                assert not _slice_status(liqo, name), f"{name}: nobody should have answered"
            assert (name in nodes) == (name in sent and slices.makes_virtual_node(body) is not None), name
    finally:
        for name in bodies:
            with contextlib.suppress(kubernetes.client.ApiException):
                custom.delete_namespaced_custom_object(*RS, TENANT, "resourceslices", name)
        wait(lambda: not _named_nodes(liqo, set(bodies)) and len(_virtual_nodes(liqo)) == 1 or None,
             "the slices' virtual nodes gone", 240)
