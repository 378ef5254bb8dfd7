"""The other built-in kinds the project's clients touch: services, endpoints, nodes and their status,
both event APIs, service accounts; and the merge-patch flavour a client can ask for explicitly."""

from __future__ import annotations

import kubernetes


def test_service_gets_a_cluster_ip_and_endpoints_are_plain_objects(core, ns):
    svc = core.create_namespaced_service(ns, {"metadata": {"name": "hub"}, "spec": {
        "selector": {"app": "hub"}, "ports": [{"port": 8081, "targetPort": 8081}]}})
    assert svc.spec.cluster_ip.startswith("10.") and svc.spec.type == "ClusterIP"
    other = core.create_namespaced_service(ns, {"metadata": {"name": "proxy"}, "spec": {"ports": [{"port": 80}]}})
    assert other.spec.cluster_ip != svc.spec.cluster_ip
    ep = core.create_namespaced_endpoints(ns, {"metadata": {"name": "hub"}, "subsets": [
        {"addresses": [{"ip": "127.0.0.2"}], "ports": [{"port": 8081}]}]})
    assert core.read_namespaced_endpoints("hub", ns).subsets[0].addresses[0].ip == ep.subsets[0].addresses[0].ip


def test_node_status_is_written_through_its_subresource(core):
    name = "sandbox-test-node"
    core.create_node({"metadata": {"name": name, "labels": {"liqo.io/type": "virtual-node"}},
                      "spec": {"taints": [{"key": "virtual-node.liqo.io/not-allowed", "value": "true",
                                           "effect": "NoExecute"}]},
                      "status": {"capacity": {"nvidia.com/gpu": "4"}}})
    try:
        assert core.read_node(name).status.capacity == {"nvidia.com/gpu": "4"}  # nodes keep status on create
        core.patch_node_status(name, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        core.patch_node(name, {"status": {"capacity": {"nvidia.com/gpu": "0"}}})  # ignored: main resource
        node = core.read_node(name)
        assert node.status.capacity == {"nvidia.com/gpu": "4"} and node.status.conditions[0].status == "False"
        nodes = core.list_node(label_selector="liqo.io/type=virtual-node").items
        assert name in [n.metadata.name for n in nodes]
    finally:
        core.delete_node(name)


def test_core_and_events_k8s_io_events(k8s, core, ns):
    core.create_namespaced_event(ns, {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p",
                                                                                     "namespace": ns},
                                      "reason": "FailedScheduling", "message": "0/3 nodes are available",
                                      "type": "Warning"})
    found = core.list_namespaced_event(ns, field_selector="involvedObject.name=p,reason=FailedScheduling").items
    assert [e.message for e in found] == ["0/3 nodes are available"]
    events_v1 = kubernetes.client.EventsV1Api(k8s)
    events_v1.create_namespaced_event(ns, {"metadata": {"name": "e2"}, "eventTime": "2026-11-22T01:00:00.000000Z",
                                           "reportingController": "sandbox", "reportingInstance": "sandbox-1",
                                           "action": "Binding", "reason": "Scheduled", "type": "Normal",
                                           "regarding": {"kind": "Pod", "name": "p", "namespace": ns}})
    assert [e.reason for e in events_v1.list_namespaced_event(ns).items] == ["Scheduled"]


def test_service_account_and_explicit_merge_patch(core, ns):
    core.create_namespaced_service_account(ns, {"metadata": {"name": "runner"}})
    created = core.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {
        "serviceAccountName": "runner", "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
        "tolerations": [{"key": "k", "operator": "Exists"}]}})
    # k and the two node taints' 300 s DefaultTolerationSeconds gave it; a merge patch replaces lists whole, where a
    # strategic merge would merge by name, so the patch repeats them (a pod's tolerations may only grow)
    existing = [core.api_client.sanitize_for_serialization(t) for t in created.spec.tolerations]
    out = core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"l": "1"}}, "spec": {"tolerations": [
        *existing, {"key": "k2", "operator": "Exists"}]}}, _content_type="application/merge-patch+json")
    assert out.metadata.labels == {"l": "1"} and len(out.spec.tolerations) == 4
    assert out.spec.service_account_name == "runner"


def test_persistent_volume_claims_are_served_and_stay_pending(core, ns):
    pvc = core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": "claim-ada"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    assert pvc.status.phase == "Pending"  # no provisioner in a sandbox
    assert [c.metadata.name for c in core.list_namespaced_persistent_volume_claim(ns).items] == ["claim-ada"]
