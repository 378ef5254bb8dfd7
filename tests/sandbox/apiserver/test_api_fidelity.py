"""API details other clients rely on, through the official client: fieldValidation, strategic merge keys
per kind, the defaults a real server fills into a Service, the wording of an unknown resource's 404."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException


def _pod_with_unknown_field(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "python:3.12", "gpus": 1}]}}


def _raw(core, ns: str, name: str) -> dict:
    return json.loads(core.read_namespaced_pod(name, ns, _preload_content=False).data)


def test_strict_field_validation_refuses_unknown_fields_with_400(core, ns):
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, _pod_with_unknown_field("strict"), field_validation="Strict")
    assert err.value.status == 400
    status = json.loads(err.value.body)
    assert (status["reason"], status["message"]) == (
        "BadRequest", 'strict decoding error: unknown field "spec.containers[0].gpus"')
    assert not core.list_namespaced_pod(ns).items


def test_default_field_validation_warns_and_drops_the_unknown_field(core, ns):
    _, code, headers = core.create_namespaced_pod_with_http_info(ns, _pod_with_unknown_field("warned"))
    assert code == 201
    assert headers.get("Warning") == '299 - "unknown field \\"spec.containers[0].gpus\\""'
    assert "gpus" not in _raw(core, ns, "warned")["spec"]["containers"][0]
    _, code, headers = core.create_namespaced_pod_with_http_info(ns, _pod_with_unknown_field("ignored"),
                                                                 field_validation="Ignore")
    assert code == 201 and "Warning" not in headers
    assert "gpus" not in _raw(core, ns, "ignored")["spec"]["containers"][0]


def test_field_validation_value_must_be_known(core, ns):
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}}, field_validation="Loose")
    assert err.value.status == 400 and "Ignore" in json.loads(err.value.body)["message"]


def _service(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": [
        {"name": "http", "port": 80}, {"name": "metrics", "port": 9090, "targetPort": "metrics"}]}}


def test_service_gets_the_defaults_a_real_server_fills(core, ns):
    made = core.create_namespaced_service(ns, _service("web"))
    assert (made.spec.type, made.spec.session_affinity) == ("ClusterIP", "None")
    assert (made.spec.ip_families, made.spec.ip_family_policy, made.spec.internal_traffic_policy) == (
        ["IPv4"], "SingleStack", "Cluster")
    assert [(p.port, p.protocol, p.target_port) for p in made.spec.ports] == [(80, "TCP", 80), (9090, "TCP", "metrics")]


def test_strategic_merge_patch_merges_service_ports_by_port(core, ns):
    core.create_namespaced_service(ns, _service("web"))
    patched = core.patch_namespaced_service("web", ns, {"spec": {"ports": [
        {"port": 80, "targetPort": 8080}, {"name": "admin", "port": 8443}]}})
    ports = {p.port: (p.name, p.target_port, p.protocol) for p in patched.spec.ports}
    assert ports == {80: ("http", 8080, "TCP"), 9090: ("metrics", "metrics", "TCP"), 8443: ("admin", 8443, "TCP")}


def test_unknown_resource_404_is_worded_as_kube_apiserver_words_it(k8s):
    with pytest.raises(ApiException) as err:
        k8s.call_api("/api/v1/namespaces/default/gizmos", "GET", auth_settings=["BearerToken"],
                     _preload_content=False)
    status = json.loads(err.value.body)
    assert (err.value.status, status["reason"], status["message"]) == (
        404, "NotFound", "the server could not find the requested resource")
