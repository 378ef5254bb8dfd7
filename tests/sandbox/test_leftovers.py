"""What the origin pool holds a module sharing an origin to: whatever it changed outside its own namespaces is
named, so the module that left it fails and not a later one (sandbox/leftovers.py, on the in-process Api)."""

from __future__ import annotations

from gpu_offload.sandbox.apiserver.api import Api
from gpu_offload.sandbox.leftovers import cluster_state, differences, system_namespaces


def _pod(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "python:3.11"}]}}


def test_a_changed_node_a_left_object_and_a_running_pod_are_named_and_the_tests_own_namespaces_are_not() -> None:
    api = Api()
    nodes, pods, namespaces = api.type("", "v1", "nodes"), api.type("", "v1", "pods"), api.type("", "v1", "namespaces")
    configmaps = api.type("", "v1", "configmaps")
    api.create(nodes, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "donor-1-gpu", "labels": {"m": "A100"}}})
    system = system_namespaces(api)
    before = cluster_state(api, system)
    assert differences(before, cluster_state(api, system)) == []

    api.create(namespaces, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t-mine"}})
    api.create(configmaps, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine"}}, "t-mine")
    assert differences(before, cluster_state(api, system)) == []  # a test's own namespace is its business

    api.patch(nodes, "", "donor-1-gpu", {"metadata": {"labels": {"m": "H100", "team": "ml"}}},
              "application/merge-patch+json")
    api.create(configmaps, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stray"}}, "default")
    api.create(pods, _pod("held"), "t-mine")
    assert differences(before, cluster_state(api, system)) == [
        "configmaps.core default/stray was left behind",
        "nodes.core donor-1-gpu: labels.m: 'A100' -> 'H100'",
        "nodes.core donor-1-gpu: labels.team: None -> 'ml'",
        "pods.core t-mine/held is still running",
    ]


def test_a_finished_pod_and_a_fault_undone_leave_nothing_while_an_active_fault_is_named() -> None:
    api = Api()
    pods = api.type("", "v1", "pods")
    system = system_namespaces(api)
    before = cluster_state(api, system)
    api.create(pods, _pod("done"), "default")
    api.replace(pods, "default", "done", {**api.get(pods, "default", "done"), "status": {"phase": "Succeeded"}},
                "status")
    assert differences(before, cluster_state(api, system)) == []  # a finished pod holds no GPU
    assert differences(before, cluster_state(api, system, ["node donor-1-gpu lost"])) == [
        "fault node donor-1-gpu lost is still active"]
