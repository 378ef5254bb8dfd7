"""Label and field selectors on list, through the official client."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException


@pytest.fixture()
def labelled(core, ns, pod):
    for name, labels in {"a": {"app": "x", "tier": "gpu"}, "b": {"app": "y", "tier": "cpu"},
                         "c": {"app": "x"}}.items():
        body = pod(name)
        body["metadata"]["labels"] = labels
        core.create_namespaced_pod(ns, body)
    core.patch_namespaced_pod_status("b", ns, {"status": {"phase": "Running"}})
    return ns


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=x", ["a", "c"]),
    ("app==x", ["a", "c"]),
    ("app!=x", ["b"]),
    ("tier in (gpu,cpu)", ["a", "b"]),
    ("tier notin (gpu)", ["b", "c"]),
    ("tier", ["a", "b"]),
    ("!tier", ["c"]),
    ("app=x,tier", ["a"]),
    ("app=z", []),
])
def test_label_selector_operators(core, labelled, selector, expected):
    items = core.list_namespaced_pod(labelled, label_selector=selector).items
    assert sorted(p.metadata.name for p in items) == expected


@pytest.mark.parametrize(("selector", "expected"), [
    ("metadata.name=a", ["a"]),
    ("metadata.name!=a", ["b", "c"]),
    ("status.phase=Running", ["b"]),
    ("status.phase!=Running", ["a", "c"]),
    ("spec.nodeName=", ["a", "b", "c"]),
])
def test_field_selector_operators(core, labelled, selector, expected):
    items = core.list_namespaced_pod(labelled, field_selector=selector).items
    assert sorted(p.metadata.name for p in items) == expected


def test_field_selector_on_namespace_across_namespaces(core, labelled):
    items = core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={labelled}").items
    assert sorted(p.metadata.name for p in items) == ["a", "b", "c"]


def test_spec_node_name_selector_follows_binding(core, labelled):
    import kubernetes

    body = kubernetes.client.V1Binding(metadata=kubernetes.client.V1ObjectMeta(name="a"),
                                       target=kubernetes.client.V1ObjectReference(kind="Node", name="n1"))
    # a real server answers a Status the generated V1Binding model cannot hold: read it raw
    resp = core.create_namespaced_pod_binding("a", labelled, body, _preload_content=False)
    assert resp.status == 201
    items = core.list_namespaced_pod(labelled, field_selector="spec.nodeName=n1").items
    assert [p.metadata.name for p in items] == ["a"]


@pytest.mark.parametrize("bad", ["app in (x", "=x", "a b c"])
def test_unparsable_label_selector_is_400(core, labelled, bad):
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod(labelled, label_selector=bad)
    assert err.value.status == 400 and "labelSelector" in json.loads(err.value.body)["message"]


def test_unsupported_field_is_400_naming_the_field(core, labelled):
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod(labelled, field_selector="spec.hostname=x")
    assert err.value.status == 400
    assert "field label not supported: spec.hostname" in json.loads(err.value.body)["message"]


def test_paging_with_limit_and_continue(core, ns):
    for i in range(7):
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"cm-{i}", "labels": {"page": "yes"}}})
    names, token, pages = [], None, 0
    while True:
        chunk = core.list_namespaced_config_map(ns, label_selector="page=yes", limit=3, _continue=token)
        names += [c.metadata.name for c in chunk.items]
        pages += 1
        token = chunk.metadata._continue
        if not token:
            break
        assert chunk.metadata.remaining_item_count == 7 - len(names)
    assert names == [f"cm-{i}" for i in range(7)] and pages == 3
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map(ns, limit=3, _continue="garbage")
    assert err.value.status == 400
