"""CRUD through the official client: the status codes, server-set metadata and update semantics that
clients rely on."""

from __future__ import annotations

import kubernetes
import pytest
from kubernetes.client import ApiException


def _status(exc: ApiException) -> dict:
    import json

    return json.loads(exc.body)


def test_create_returns_201_with_server_set_metadata(k8s, ns, pod):
    body, status, _ = kubernetes.client.CoreV1Api(k8s).create_namespaced_pod_with_http_info(ns, pod("a"))
    assert status == 201
    meta = body.metadata
    assert meta.namespace == ns and meta.uid and meta.resource_version and meta.creation_timestamp
    assert meta.generation == 1
    assert body.status.phase == "Pending"
    assert body.spec.restart_policy == "Always" and body.spec.service_account_name == "default"


def test_create_twice_is_409_already_exists(core, ns, pod):
    core.create_namespaced_pod(ns, pod("a"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, pod("a"))
    assert err.value.status == 409
    st = _status(err.value)
    assert (st["kind"], st["reason"], st["details"]["name"]) == ("Status", "AlreadyExists", "a")


def test_generate_name_gets_a_unique_suffix(core, ns):
    made = {core.create_namespaced_config_map(ns, {"metadata": {"generateName": "cfg-"}}).metadata.name
            for _ in range(5)}
    assert len(made) == 5 and all(n.startswith("cfg-") and len(n) == 9 for n in made)


def test_get_missing_is_404_naming_the_object(core, ns):
    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("nope", ns)
    st = _status(err.value)
    assert err.value.status == 404 and st["reason"] == "NotFound" and '"nope" not found' in st["message"]


def test_create_in_missing_namespace_is_404(core, pod):
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("no-such-ns", pod("a"))
    assert err.value.status == 404 and _status(err.value)["details"]["name"] == "no-such-ns"


def test_put_with_stale_resource_version_is_409_conflict(core, ns):
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {"k": "1"}})
    cm.data = {"k": "2"}
    updated = core.replace_namespaced_config_map("c", ns, cm)
    assert int(updated.metadata.resource_version) > int(cm.metadata.resource_version)
    cm.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("c", ns, cm)
    assert err.value.status == 409 and _status(err.value)["reason"] == "Conflict"
    assert core.read_namespaced_config_map("c", ns).data == {"k": "2"}


def test_update_keeps_server_owned_fields_and_bumps_generation(k8s, ns):
    batch = kubernetes.client.BatchV1Api(k8s)
    job = batch.create_namespaced_job(ns, {
        "metadata": {"name": "j"},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                        "containers": [{"name": "m", "image": "x"}]}}}})
    patched = batch.patch_namespaced_job("j", ns, {"metadata": {"labels": {"a": "b"}}})
    assert patched.metadata.generation == 1 and patched.metadata.uid == job.metadata.uid
    patched = batch.patch_namespaced_job("j", ns, {"spec": {"suspend": False}})
    assert patched.metadata.generation == 2


def test_status_subresource_is_separate_from_the_main_resource(core, ns, pod):
    created = core.create_namespaced_pod(ns, pod("a"))
    created.status.phase = "Running"
    assert core.replace_namespaced_pod("a", ns, created).status.phase == "Pending"
    assert core.patch_namespaced_pod_status("a", ns, {"status": {"phase": "Running"}}).status.phase == "Running"


def test_pod_spec_is_immutable_except_images_and_tolerations(core, ns, pod):
    core.create_namespaced_pod(ns, pod("a"))
    core.patch_namespaced_pod("a", ns, {"spec": {"containers": [{"name": "main", "image": "python:3.13"}]}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("a", ns, {"spec": {"restartPolicy": "Never"}})
    assert err.value.status == 422 and _status(err.value)["details"]["causes"][0]["field"] == "spec"


def test_strategic_merge_patch_merges_containers_and_env_by_name(core, ns):
    body = {"metadata": {"name": "a"}, "spec": {
        "containers": [{"name": "main", "image": "i", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                       {"name": "side", "image": "s"}],
        "tolerations": [{"key": "k1", "operator": "Exists"}]}}
    created = core.create_namespaced_pod(ns, body)
    # kube-apiserver's DefaultTolerationSeconds added 300 s of each node taint; a pod's tolerations may only grow
    existing = [core.api_client.sanitize_for_serialization(t) for t in created.spec.tolerations]
    assert [t["key"] for t in existing] == ["k1", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]
    patch = {"spec": {"containers": [{"name": "main", "image": "i2"}],
                      "tolerations": [*existing, {"key": "k2", "operator": "Exists"}]}}
    out = core.patch_namespaced_pod("a", ns, patch)  # the client sends strategic merge for a dict body
    assert [(c.name, c.image) for c in out.spec.containers] == [("main", "i2"), ("side", "s")]
    assert [e.name for e in out.spec.containers[0].env] == ["A", "B"]
    assert [t.key for t in out.spec.tolerations] == [*(t["key"] for t in existing), "k2"]


def test_json_patch_and_merge_patch(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}},
                                           "data": {"x": "1"}})
    out = core.patch_namespaced_config_map("c", ns, [{"op": "add", "path": "/data/y", "value": "2"},
                                                     {"op": "remove", "path": "/metadata/labels/a"}])
    assert out.data == {"x": "1", "y": "2"} and out.metadata.labels == {"b": "2"}
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("c", ns, [{"op": "test", "path": "/data/x", "value": "9"}])
    assert err.value.status == 422
    assert core.read_namespaced_config_map("c", ns).data == {"x": "1", "y": "2"}  # nothing half-applied


def test_finalizers_hold_a_deleted_object_until_removed(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c", "finalizers": ["example.com/hold"]}})
    core.delete_namespaced_config_map("c", ns)
    held = core.read_namespaced_config_map("c", ns)
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("c", ns, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("c", ns)
    assert err.value.status == 404


def test_delete_preconditions_and_grace_period(core, ns, pod):
    created = core.create_namespaced_pod(ns, pod("a"))
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod("a", ns, body=kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(uid="not-the-uid")))
    assert err.value.status == 409
    gone = core.delete_namespaced_pod("a", ns, grace_period_seconds=0)
    assert gone.metadata.uid == created.metadata.uid
    assert not core.list_namespaced_pod(ns).items


def test_secret_string_data_is_stored_as_base64_data(core, ns):
    sec = core.create_namespaced_secret(ns, {"metadata": {"name": "s"}, "stringData": {"token": "abc"}})
    assert sec.data == {"token": "YWJj"} and sec.string_data is None and sec.type == "Opaque"


def test_new_namespace_gets_a_default_service_account(core, ns):
    assert [sa.metadata.name for sa in core.list_namespaced_service_account(ns).items] == ["default"]


def test_immutable_fields_refuse_updates(k8s, core, ns):
    core.create_namespaced_secret(ns, {"metadata": {"name": "frozen"}, "immutable": True, "stringData": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_secret("frozen", ns, {"stringData": None, "data": {"a": "Mg=="}})
    assert err.value.status == 422 and _status(err.value)["details"]["causes"][0]["field"] == "data"
    core.patch_namespaced_secret("frozen", ns, {"metadata": {"labels": {"ok": "yes"}}})  # metadata may change
    batch = kubernetes.client.BatchV1Api(k8s)
    batch.create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {"suspend": True, "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}}})
    with pytest.raises(ApiException) as err:
        batch.patch_namespaced_job("j", ns, {"spec": {"template": {"spec": {"containers": [
            {"name": "m", "image": "y"}]}}}})
    assert err.value.status == 422 and _status(err.value)["details"]["causes"][0]["field"] == "spec.template"
    assert batch.patch_namespaced_job("j", ns, {"spec": {"parallelism": 0}}).spec.parallelism == 0
