"""Each injectable fault, applied from a test or over the HTTP control endpoint, seen through the client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import kubernetes
import pytest
import urllib3
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until

core, custom, namespace, offloaded_namespace = (fixtures.core, fixtures.custom, fixtures.namespace,
                                               fixtures.offloaded_namespace)



@pytest.fixture(autouse=True)
def clear_faults(origin):
    yield
    control(origin, "DELETE")


def control(origin, method: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(origin.sandbox.url + "/sandbox/faults", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def _pod(name: str, code: str = "import time; time.sleep(600)", gpus: int = 1, image: str = "python:3.11") -> dict:
    return {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "command": ["python3", "-u", "-c", code],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def _running(core, offloaded_namespace: str, name: str):
    return wait_until(lambda: (p := core.read_namespaced_pod(name, offloaded_namespace)).status.phase == "Running" and p,
                      f"{name} running")


def _failed(core, offloaded_namespace: str, name: str):
    return wait_until(lambda: (p := core.read_namespaced_pod(name, offloaded_namespace)).status.phase == "Failed" and p,
                      f"{name} failed")


def _condition(pod, kind: str):
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def test_a_node_that_stops_answering_goes_unknown_after_its_grace_and_its_pods_are_evicted_by_toleration(
        origin, core, offloaded_namespace):
    custom = kubernetes.client.CustomObjectsApi(origin.sandbox.api_client())
    brief = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}
    victim = _pod("victim")
    victim["spec"]["tolerations"] = [brief]
    core.create_namespaced_pod(offloaded_namespace, victim)
    node = _running(core, offloaded_namespace, "victim").spec.node_name
    patient = _pod("patient")  # no toleration of its own: Kubernetes' default, 300 s
    patient["spec"]["nodeName"] = node
    core.create_namespaced_pod(offloaded_namespace, patient)
    _running(core, offloaded_namespace, "patient")
    other = "donor-2-gpu" if node == "donor-1-gpu" else "donor-1-gpu"
    answer = control(origin, "POST", {"fault": "node-not-ready", "node": node, "grace": 1})
    assert answer == {"applied": "node-not-ready", "result": 2}
    with pytest.raises(kubernetes.client.ApiException) as refused:  # the node's kubelet does not answer
        core.read_namespaced_pod_log("victim", offloaded_namespace)
    assert refused.value.status == 500 and "connection refused" in refused.value.body
    evicted = wait_until(lambda: (p := core.read_namespaced_pod("victim", offloaded_namespace)).metadata.deletion_timestamp
                         and p, "the victim evicted", timeout=30)
    target = _condition(evicted, "DisruptionTarget")
    assert (target.status, target.reason) == ("True", "DeletionByTaintManager")
    # nobody on the node confirms the end: Running and Terminating, not Ready
    assert evicted.status.phase == "Running" and _condition(evicted, "Ready").status == "False"
    patient = core.read_namespaced_pod("patient", offloaded_namespace)
    assert patient.metadata.deletion_timestamp is None and _condition(patient, "Ready").status == "False"
    ready = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")
    fc = custom.get_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters", node.removesuffix("-gpu"))
    statuses = {c["type"]: c["status"] for m in fc["status"]["modules"].values() for c in m["conditions"]}
    assert statuses["NetworkConnectionStatus"] == "Error"
    core.create_namespaced_pod(offloaded_namespace, _pod("next"))
    assert _running(core, offloaded_namespace, "next").spec.node_name == other
    assert control(origin, "GET")["lostNodes"] == [node]
    control(origin, "POST", {"fault": "node-ready", "node": node})
    ready = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
    assert ready.status == "True" and not [t for t in core.read_node(node).spec.taints or []
                                           if t.key == "node.kubernetes.io/unreachable"]
    # its kubelet is back: it finishes the eviction and reports the pod it kept
    wait_until(lambda: not [p for p in core.list_namespaced_pod(offloaded_namespace).items
                            if p.metadata.name == "victim"], "the victim gone once its node answers")
    wait_until(lambda: _condition(core.read_namespaced_pod("patient", offloaded_namespace), "Ready").status == "True",
               "the patient Ready again")


def test_oom_killed_container(origin, core, offloaded_namespace):
    core.create_namespaced_pod(offloaded_namespace, _pod("hungry"))
    _running(core, offloaded_namespace, "hungry")
    origin.call(origin.faults.oom_kill(offloaded_namespace, "hungry"))
    state = _failed(core, offloaded_namespace, "hungry").status.container_statuses[0].state.terminated
    assert (state.reason, state.exit_code) == ("OOMKilled", 137)


def test_evicted_pod(origin, core, offloaded_namespace):
    core.create_namespaced_pod(offloaded_namespace, _pod("evictee"))
    _running(core, offloaded_namespace, "evictee")
    control(origin, "POST", {"fault": "evict", "namespace": offloaded_namespace, "pod": "evictee"})
    pod = _failed(core, offloaded_namespace, "evictee")
    assert pod.status.reason == "Evicted" and "low on resource" in pod.status.message


def test_image_pull_fault_then_recovery(origin, core, offloaded_namespace):
    control(origin, "POST", {"fault": "image-pull", "image": "python:3.10"})
    core.create_namespaced_pod(offloaded_namespace, _pod("pull", code="print('pulled')", image="python:3.10"))
    wait_until(lambda: (s := core.read_namespaced_pod("pull", offloaded_namespace).status.container_statuses)
               and s[0].state.waiting and s[0].state.waiting.reason == "ImagePullBackOff", "ImagePullBackOff")
    control(origin, "DELETE")
    wait_until(lambda: core.read_namespaced_pod("pull", offloaded_namespace).status.phase == "Succeeded", "the pull to succeed")


def test_api_5xx_on_a_chosen_path(origin, core, offloaded_namespace):
    control(origin, "POST", {"fault": "api-error", "path": f"^/api/v1/namespaces/{offloaded_namespace}/pods$", "status": 503,
                             "methods": ["POST"], "times": 1})
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.create_namespaced_pod(offloaded_namespace, _pod("first", code="print(1)"))
    assert err.value.status == 503
    core.create_namespaced_pod(offloaded_namespace, _pod("first", code="print(1)"))  # the rule fired its one time
    core.list_namespaced_pod(offloaded_namespace)  # other verbs were never affected
    assert control(origin, "GET")["apiRules"][0]["fired"] == 1


def test_api_latency_on_a_chosen_path(origin, core, offloaded_namespace):
    rule = origin.faults.api_latency(f"^/api/v1/namespaces/{offloaded_namespace}/configmaps", 0.2, times=2)
    core.list_namespaced_config_map(offloaded_namespace)
    core.list_namespaced_config_map(offloaded_namespace)
    assert origin.sandbox.api.faults.fired(rule) == 2  # slowed, still served (no timing asserted)


def test_control_endpoint_refuses_rules_that_would_lock_it_out(origin):
    with pytest.raises(urllib.error.HTTPError) as err:
        control(origin, "POST", {"fault": "api-error", "path": ".*"})
    assert err.value.code == 400 and "anchor it" in json.loads(err.value.read())["error"]


def test_log_stream_cut_mid_way(origin, core, offloaded_namespace):
    code = "import sys, time\nfor i in range(400):\n print('line', i, flush=True); time.sleep(0.01)"
    core.create_namespaced_pod(offloaded_namespace, _pod("chatty", code=code))
    _running(core, offloaded_namespace, "chatty")
    resp = core.read_namespaced_pod_log("chatty", offloaded_namespace, follow=True, _preload_content=False)
    got, cut = b"", None
    try:
        for chunk in resp.stream(64):
            got += chunk
            if b"line 3\n" in got and cut is None:
                cut = control(origin, "POST", {"fault": "cut-logs", "namespace": offloaded_namespace, "pod": "chatty"})
                assert cut["result"] == 1
    except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError):
        pass  # the connection dropped mid-stream, as when a kubelet or a proxy goes away
    wait_until(lambda: core.read_namespaced_pod("chatty", offloaded_namespace).status.phase == "Succeeded", "chatty done")
    full = core.read_namespaced_pod_log("chatty", offloaded_namespace, _preload_content=False).data
    assert full.count(b"\n") == 400
    assert b"line 399\n" not in got, "the follow stream should have been cut before the end"


def test_fault_on_a_missing_pod_or_node_names_the_fix(origin):
    for body, hint in (({"fault": "oom-kill", "namespace": "nowhere", "pod": "ghost"}, "wait until it is Running"),
                       ({"fault": "node-not-ready", "node": "no-such-node"}, "kubectl get nodes"),
                       ({"fault": "evict", "namespace": "x"}, "needs 'pod'")):
        with pytest.raises(urllib.error.HTTPError) as err:
            control(origin, "POST", body)
        assert err.value.code == 400 and hint in json.loads(err.value.read())["error"]
    assert control(origin, "GET")["lostNodes"] == []


def test_an_api_rule_removed_from_the_server_is_no_longer_listed_as_injected(origin, core):
    """A shared origin's next module reads ``faults.active()``: a rule a test took off the server is not in it, and
    one that ran out of its times still is, with how often it fired."""
    removed = origin.faults.api_error("^/api/v1/namespaces/nowhere/pods$", status=500)
    spent = origin.faults.api_error("^/api/v1/namespaces/nowhere/secrets$", status=500, times=1)
    try:
        origin.sandbox.api.faults.remove(removed)
        with pytest.raises(kubernetes.client.ApiException) as refused:
            core.list_namespaced_secret("nowhere")
        assert refused.value.status == 500 and not origin.sandbox.api.faults.acting(spent)
        listed = origin.faults.active()["apiRules"]
        assert [(r["path"], r["fired"]) for r in listed] == [("^/api/v1/namespaces/nowhere/secrets$", 1)]
    finally:
        origin.faults.clear()
