"""EndpointSlices of Services, kept current as pods come, become ready and go, through the official client."""

from __future__ import annotations

import kubernetes
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until

core, namespace = fixtures.core, fixtures.namespace


def _pod(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"terminationGracePeriodSeconds": 1, "hostname": name, "subdomain": "web", "containers": [
                {"name": "main", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(600)"],
                 "ports": [{"name": "http", "containerPort": 8080}]}]}}


def _slices(origin, namespace: str, service: str):
    discovery = kubernetes.client.DiscoveryV1Api(origin.sandbox.api_client())
    return discovery.list_namespaced_endpoint_slice(namespace, label_selector=f"kubernetes.io/service-name={service}").items


def test_a_services_slice_follows_its_pods(origin, core, namespace):
    svc = core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}})
    for name in ("a", "b"):
        core.create_namespaced_pod(namespace, _pod(name))
    ips = {n: wait_until(lambda n=n: core.read_namespaced_pod(n, namespace).status.pod_ip, f"pod {n}'s IP")
           for n in ("a", "b")}

    def both_ready():
        found = _slices(origin, namespace, "web")
        return len(found) == 1 and sorted((e.addresses[0], e.conditions.ready) for e in found[0].endpoints) == \
            sorted((ip, True) for ip in ips.values()) and found[0]

    slice_ = wait_until(both_ready, "a slice with both pods ready")
    assert (slice_.address_type, [(p.name, p.port, p.protocol) for p in slice_.ports]) == ("IPv4", [("web", 8080, "TCP")])
    assert slice_.metadata.labels["endpointslice.kubernetes.io/managed-by"] == "endpointslice-controller.k8s.io"
    assert slice_.metadata.owner_references[0].uid == svc.metadata.uid
    assert sorted((e.target_ref.name, e.hostname, e.node_name is not None) for e in slice_.endpoints) == [
        ("a", "a", True), ("b", "b", True)]

    core.delete_namespaced_pod("a", namespace)
    wait_until(lambda: [e.addresses[0] for e in _slices(origin, namespace, "web")[0].endpoints] == [ips["b"]],
               "pod a to leave the slice")
    core.delete_namespaced_service("web", namespace)
    wait_until(lambda: not _slices(origin, namespace, "web"), "the slice to go with its Service")
