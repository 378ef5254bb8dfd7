"""Deletion semantics through the official client: ownerReference garbage collection (Background,
Foreground, Orphan), graceful pod deletion handed to a kubelet, namespace termination."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client import ApiException


def _owned_secret(core, ns, name, owner, kind="Pod", api_version="v1"):
    ref = {"apiVersion": api_version, "kind": kind, "name": owner.metadata.name, "uid": owner.metadata.uid}
    return core.create_namespaced_secret(ns, {"metadata": {"name": name, "ownerReferences": [ref]},
                                              "stringData": {"bundle": "x"}})


def _exists(read, *args) -> bool:
    try:
        read(*args)
        return True
    except ApiException as exc:
        assert exc.status == 404
        return False


def test_a_secret_owned_by_a_pod_goes_with_it(core, ns, pod):
    owner = core.create_namespaced_pod(ns, pod("runner"))
    _owned_secret(core, ns, "bundle", owner)
    core.create_namespaced_secret(ns, {"metadata": {"name": "unrelated"}})
    core.delete_namespaced_pod("runner", ns)
    assert not _exists(core.read_namespaced_secret, "bundle", ns)
    assert _exists(core.read_namespaced_secret, "unrelated", ns)


def test_a_dependent_with_a_surviving_owner_stays(core, ns, pod):
    a, b = core.create_namespaced_pod(ns, pod("a")), core.create_namespaced_pod(ns, pod("b"))
    refs = [{"apiVersion": "v1", "kind": "Pod", "name": o.metadata.name, "uid": o.metadata.uid} for o in (a, b)]
    core.create_namespaced_config_map(ns, {"metadata": {"name": "shared", "ownerReferences": refs}})
    core.delete_namespaced_pod("a", ns)
    assert _exists(core.read_namespaced_config_map, "shared", ns)
    core.delete_namespaced_pod("b", ns)
    assert not _exists(core.read_namespaced_config_map, "shared", ns)


def test_orphan_propagation_keeps_dependents_and_drops_the_reference(core, ns, pod):
    owner = core.create_namespaced_pod(ns, pod("runner"))
    _owned_secret(core, ns, "bundle", owner)
    core.delete_namespaced_pod("runner", ns, propagation_policy="Orphan")
    assert core.read_namespaced_secret("bundle", ns).metadata.owner_references is None


def test_foreground_deletion_waits_for_blocking_dependents(core, ns):
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid,
           "blockOwnerDeletion": True}
    core.create_namespaced_config_map(ns, {"metadata": {"name": "dep", "ownerReferences": [ref],
                                                        "finalizers": ["example.com/hold"]}})
    core.delete_namespaced_config_map("owner", ns, propagation_policy="Foreground")
    waiting = core.read_namespaced_config_map("owner", ns)
    assert waiting.metadata.deletion_timestamp and "foregroundDeletion" in waiting.metadata.finalizers
    assert core.read_namespaced_config_map("dep", ns).metadata.deletion_timestamp
    core.patch_namespaced_config_map("dep", ns, {"metadata": {"finalizers": None}})
    assert not _exists(core.read_namespaced_config_map, "dep", ns)
    assert not _exists(core.read_namespaced_config_map, "owner", ns)


def test_jobs_orphan_their_pods_unless_asked_to_propagate(k8s, ns, wait):
    batch, core = kubernetes.client.BatchV1Api(k8s), kubernetes.client.CoreV1Api(k8s)
    spec = {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}}
    for name in ("kept", "cascaded"):
        batch.create_namespaced_job(ns, {"metadata": {"name": name}, "spec": spec})
        wait(lambda n=name: core.list_namespaced_pod(ns, label_selector=f"job-name={n}").items, f"pod of {name}")
    batch.delete_namespaced_job("kept", ns)  # batch/v1 default: orphan
    batch.delete_namespaced_job("cascaded", ns, propagation_policy="Background")
    assert core.list_namespaced_pod(ns, label_selector="job-name=kept").items
    assert not core.list_namespaced_pod(ns, label_selector="job-name=cascaded").items


def test_bound_pods_wait_for_their_kubelet_to_finish_a_graceful_deletion(core, ns, pod, api_sandbox):
    api = api_sandbox.api
    node = f"kubelet-{ns}"
    api.pod_termination = lambda p: p["spec"].get("nodeName") == node
    try:
        core.create_namespaced_pod(ns, pod("p", nodeName=node))
        marked = core.delete_namespaced_pod("p", ns, grace_period_seconds=30)
        assert marked.metadata.deletion_timestamp and marked.metadata.deletion_grace_period_seconds == 30
        assert _exists(core.read_namespaced_pod, "p", ns)  # the kubelet is stopping the processes
        core.delete_namespaced_pod("p", ns, grace_period_seconds=0)  # what the kubelet sends when done
        assert not _exists(core.read_namespaced_pod, "p", ns)
    finally:
        api.pod_termination = None


def test_namespace_deletion_removes_its_objects(core, pod):
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_pod("doomed", pod("p"))
    core.create_namespaced_config_map("doomed", {"metadata": {"name": "held", "finalizers": ["example.com/x"]}})
    core.delete_namespace("doomed")
    ns = core.read_namespace("doomed")
    assert ns.status.phase == "Terminating" and ns.metadata.deletion_timestamp
    assert not core.list_namespaced_pod("doomed").items
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("doomed", {"metadata": {"name": "late"}})
    assert err.value.status == 403 and "being terminated" in json.loads(err.value.body)["message"]
    core.patch_namespaced_config_map("held", "doomed", {"metadata": {"finalizers": None}})
    assert not _exists(core.read_namespace, "doomed")
