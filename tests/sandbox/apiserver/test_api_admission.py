"""Admission: invalid objects get the 422 Invalid a real API server returns, with field paths. Bodies the
official client would not send are posted as raw HTTP; nothing of a rejected object is stored."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from gpu_offload.sandbox.apiserver.errors import Cause
from kubernetes import dynamic
from kubernetes.client import ApiException


def post(url: str, body: object, method: str = "POST", ctype: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def causes(status: dict) -> list[tuple[str, str]]:
    return [(c["field"], c["reason"]) for c in status["details"]["causes"]]


@pytest.fixture()
def pods_url(api_sandbox, ns):
    return f"{api_sandbox.url}/api/v1/namespaces/{ns}/pods"


def test_unknown_field_under_strict_validation_is_400_with_its_path(pods_url, pod):
    body = pod("p")
    body["spec"]["containers"][0]["gpus"] = 1
    code, st = post(f"{pods_url}?fieldValidation=Strict", body)
    assert (code, st["kind"], st["reason"]) == (400, "Status", "BadRequest")
    assert st["message"] == 'strict decoding error: unknown field "spec.containers[0].gpus"'
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{pods_url}/p", timeout=60)
    assert err.value.code == 404  # nothing half-written


def test_missing_required_field_and_wrong_type(pods_url):
    code, st = post(pods_url, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                               "spec": {"containers": [{"image": 3}]}})
    assert code == 422
    assert sorted(causes(st)) == [("spec.containers[0].image", "FieldValueInvalid"),
                          ("spec.containers[0].name", "FieldValueRequired")]


def test_bad_names_and_mismatched_kinds(pods_url, pod):
    code, st = post(pods_url, pod("Not_A_Name"))
    assert code == 422 and causes(st) == [("metadata.name", "FieldValueInvalid")]
    code, st = post(pods_url, {**pod("p"), "kind": "Secret"})
    assert code == 400 and "do not match the endpoint" in st["message"]
    code, st = post(pods_url, b"{not json")
    assert code == 400 and "not valid JSON" in st["message"]
    code, st = post(pods_url, {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}})
    assert code == 422 and ("metadata.name", "FieldValueRequired") in causes(st)


def test_custom_resources_are_validated_against_the_crd_schema(api_sandbox, ns):
    url = f"{api_sandbox.url}/apis/offloading.liqo.io/v1beta1/namespaces/{ns}/namespaceoffloadings"
    body = {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading"},
            "spec": {"podOffloadingStrategy": "Nowhere", "clusterSelector": {"nodeSelectorTerms": []},
                     "extra": True}}
    code, st = post(f"{url}?fieldValidation=Strict", body)
    assert code == 400 and st["message"] == 'strict decoding error: unknown field "spec.extra"'
    code, st = post(url, body)  # the default (Warn) drops the unknown field; the bad value stays an error
    assert code == 422
    assert sorted(causes(st)) == [("spec.podOffloadingStrategy", "FieldValueNotSupported")]
    body["spec"]["podOffloadingStrategy"] = "Remote"
    code, created = post(url, body)
    assert code == 201 and created["metadata"]["uid"] and "extra" not in created["spec"]


def test_custom_resources_through_the_dynamic_client(k8s, ns):
    client = dynamic.DynamicClient(k8s)
    slices = client.resources.get(api_version="authentication.liqo.io/v1beta1", kind="ResourceSlice")
    made = slices.create(namespace=ns, body={
        "apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "gpu"},
        "spec": {"class": "default", "resources": {"nvidia.com/gpu": "2"}}})
    assert made.metadata.generation == 1
    got = slices.get(namespace=ns, name="gpu")
    assert got.spec.resources["nvidia.com/gpu"] == "2"
    with pytest.raises(ApiException) as err:
        slices.create(namespace=ns, body={"apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice",
                                          "metadata": {"name": "bad"}, "spec": {"resources": []}})
    assert err.value.status == 422


def test_mutating_and_validating_hooks_run_around_schema_validation(api_sandbox, core, ns):
    def add_label(req):
        if req.namespace == ns:
            req.object["metadata"].setdefault("labels", {})["mutated"] = "yes"

    def no_forbidden(req):
        if req.namespace == ns and req.name.startswith("forbidden"):
            return [Cause("FieldValueForbidden", "Forbidden: names starting with forbidden", "metadata.name")]
        return []

    def break_schema(req):
        if req.namespace == ns and req.name == "broken":
            req.object["spec"] = {"bogus": 1}

    adm = api_sandbox.api.admission
    adm.add_mutating("configmaps", add_label)
    adm.add_mutating("configmaps", break_schema)
    adm.add_validating("configmaps", no_forbidden)
    try:
        assert core.create_namespaced_config_map(ns, {"metadata": {"name": "ok"}}).metadata.labels == {"mutated": "yes"}
        with pytest.raises(ApiException) as err:
            core.create_namespaced_config_map(ns, {"metadata": {"name": "forbidden-1"}})
        assert err.value.status == 422 and json.loads(err.value.body)["details"]["causes"][0]["field"] == "metadata.name"
        with pytest.raises(ApiException) as err:  # a mutation that breaks the schema is caught by validation
            core.create_namespaced_config_map(ns, {"metadata": {"name": "broken"}})
        assert err.value.status == 422
    finally:
        for hook in (add_label, break_schema, no_forbidden):
            adm.remove(hook)
    assert core.create_namespaced_config_map(ns, {"metadata": {"name": "forbidden-2"}}).metadata.labels is None


def test_unknown_patch_type_is_415(api_sandbox, core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    url = f"{api_sandbox.url}/api/v1/namespaces/{ns}/configmaps/c"
    code, st = post(url, {"data": {}}, method="PATCH", ctype="application/apply-patch+yaml")
    assert code == 415 and "server-side apply is not emulated" in st["message"]


def test_a_crd_created_through_the_api_is_served_and_enforced(k8s, ns):
    import kubernetes

    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "required": ["size"],
                                                                  "properties": {"size": {"type": "integer"}}}}}}}]}}
    kubernetes.client.ApiextensionsV1Api(k8s).create_custom_resource_definition(crd)
    custom = kubernetes.client.CustomObjectsApi(k8s)
    made = custom.create_namespaced_custom_object("example.com", "v1", ns, "widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}})
    assert made["metadata"]["uid"] and made["spec"] == {"size": 3}
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("example.com", "v1", ns, "widgets", {
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "v"}, "spec": {}})
    assert err.value.status == 422 and causes(json.loads(err.value.body)) == [("spec.size", "FieldValueRequired")]


def test_a_deleted_crd_takes_its_objects_and_is_no_longer_served(k8s, ns):
    import kubernetes

    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "sprockets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "sprockets", "singular": "sprocket", "kind": "Sprocket",
                              "listKind": "SprocketList"},
                    "versions": [{"name": v, "served": True, "storage": v == "v1", "schema": {"openAPIV3Schema": {
                        "type": "object"}}} for v in ("v1", "v1beta1")]}}
    extensions = kubernetes.client.ApiextensionsV1Api(k8s)
    custom = kubernetes.client.CustomObjectsApi(k8s)
    extensions.create_custom_resource_definition(crd)
    custom.create_namespaced_custom_object("example.com", "v1", ns, "sprockets", {
        "apiVersion": "example.com/v1", "kind": "Sprocket", "metadata": {"name": "s"}})
    extensions.delete_custom_resource_definition("sprockets.example.com")
    for version in ("v1", "v1beta1"):  # a real API server answers 404 for the resource once its CRD is gone
        with pytest.raises(ApiException) as err:
            custom.list_namespaced_custom_object("example.com", version, ns, "sprockets")
        assert err.value.status == 404
    # installed again, it starts empty: the objects went with the CRD
    extensions.create_custom_resource_definition(crd)
    try:
        assert custom.list_namespaced_custom_object("example.com", "v1", ns, "sprockets")["items"] == []
    finally:
        extensions.delete_custom_resource_definition("sprockets.example.com")


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda p: p["metadata"].update(labels={"user": "ada@example.com"}), "metadata.labels.user"),
    (lambda p: p["metadata"].update(labels={"bad key!": "x"}), "metadata.labels"),
    (lambda p: p["spec"]["containers"][0].update(name="Main_Container"), "spec.containers[0].name"),
    (lambda p: p["spec"]["containers"][0].update(env=[{"name": "1BAD", "value": "x"}]),
     "spec.containers[0].env[0].name"),
    (lambda p: p["spec"]["containers"][0].update(resources={"limits": {"memory": "1 GB"}}),
     "spec.containers[0].resources.limits[memory]"),
    (lambda p: p["spec"]["containers"][0].update(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
     "spec.containers[0].resources.requests[cpu]"),
    (lambda p: p["spec"]["containers"][0].update(
        resources={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}),
     "spec.containers[0].resources.requests[nvidia.com/gpu]"),
])
def test_field_rules_beyond_the_schema(pods_url, pod, mutate, field):
    body = pod("p")
    mutate(body)
    code, st = post(pods_url, body)
    assert code == 422 and [c[0] for c in causes(st)] == [field], st


def test_secrets_over_one_mebibyte_are_refused(api_sandbox, ns):
    import base64

    url = f"{api_sandbox.url}/api/v1/namespaces/{ns}/secrets"
    big = base64.b64encode(b"x" * (1024 * 1024 + 1)).decode()
    code, st = post(url, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bundle"}, "data": {"b": big}})
    assert code == 422 and causes(st) == [("data", "FieldValueTooLong")]
    code, st = post(url, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "b64"}, "data": {"b": "!!"}})
    assert code == 422 and causes(st) == [("data[b]", "FieldValueInvalid")]
    just = base64.b64encode(b"x" * (1024 * 1024)).decode()
    code, _ = post(url, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fits"}, "data": {"b": just}})
    assert code == 201


def test_a_validating_hook_can_refuse_a_deletion(api_sandbox, core, ns):
    def keep_protected(req):
        if req.namespace == ns and (req.object["metadata"].get("labels") or {}).get("protected") == "yes":
            return [Cause("FieldValueForbidden", "Forbidden: protected objects cannot be deleted", "metadata.labels")]
        return []

    core.create_namespaced_config_map(ns, {"metadata": {"name": "keep", "labels": {"protected": "yes"}}})
    api_sandbox.api.admission.add_validating("configmaps", keep_protected, operations=("DELETE",))
    try:
        with pytest.raises(ApiException) as err:
            core.delete_namespaced_config_map("keep", ns)
        assert err.value.status == 422
        assert core.read_namespaced_config_map("keep", ns).metadata.deletion_timestamp is None
    finally:
        api_sandbox.api.admission.remove(keep_protected)


def test_protobuf_bodies_are_415_not_misread(pods_url):
    code, st = post(pods_url, b"k8s\x00\x0a\x0f", ctype="application/vnd.kubernetes.protobuf")
    assert code == 415 and "application/json" in st["message"]


def test_patching_a_custom_object_whose_status_was_never_written_leaves_status_absent(k8s):
    import kubernetes

    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "gadgets.example.com"},
           "spec": {"group": "example.com", "scope": "Cluster",
                    "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                                      "status": {"type": "object"}}}}}]}}
    kubernetes.client.ApiextensionsV1Api(k8s).create_custom_resource_definition(crd)
    custom = kubernetes.client.CustomObjectsApi(k8s)
    custom.create_cluster_custom_object("example.com", "v1", "gadgets", {
        "apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {"size": 1}})
    patched = custom.patch_cluster_custom_object("example.com", "v1", "gadgets", "g", {"spec": {"size": 2}})
    assert patched["spec"] == {"size": 2} and "status" not in patched
