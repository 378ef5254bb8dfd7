"""The patch flavours on plain dicts: what clients send and what they expect back."""

from __future__ import annotations

import pytest
from gpu_offload.sandbox.apiserver.errors import ApiError
from gpu_offload.sandbox.apiserver.patching import apply_patch, json_patch, merge_patch, strategic_merge_patch

POD = {"metadata": {"labels": {"a": "1"}, "finalizers": ["x"]},
       "spec": {"containers": [{"name": "main", "image": "i1", "env": [{"name": "A", "value": "1"}]},
                               {"name": "side", "image": "s1"}],
                "tolerations": [{"key": "t1", "operator": "Exists"}]}}


def test_merge_patch_replaces_lists_and_deletes_with_null():
    out = merge_patch(POD, {"metadata": {"labels": {"a": None, "b": "2"}},
                            "spec": {"containers": [{"name": "only"}]}})
    assert out["metadata"]["labels"] == {"b": "2"}
    assert out["spec"]["containers"] == [{"name": "only"}]
    assert POD["metadata"]["labels"] == {"a": "1"}  # the input is untouched


def test_strategic_merge_by_name_and_directives():
    out = strategic_merge_patch(POD, {"spec": {"containers": [
        {"name": "main", "env": [{"name": "B", "value": "2"}]},
        {"name": "side", "$patch": "delete"},
        {"name": "new", "image": "n"}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["main", "new"]
    assert out["spec"]["containers"][0] == {"name": "main", "image": "i1",
                                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}


def test_strategic_merge_replaces_tolerations_and_unions_finalizers():
    out = strategic_merge_patch(POD, {"metadata": {"finalizers": ["y", "x"]},
                                      "spec": {"tolerations": [{"key": "t2", "operator": "Exists"}]}})
    assert out["spec"]["tolerations"] == [{"key": "t2", "operator": "Exists"}]
    assert out["metadata"]["finalizers"] == ["x", "y"]
    out = strategic_merge_patch(POD, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}})
    assert out["metadata"]["finalizers"] == []


def test_strategic_merge_replace_directive_and_missing_key():
    out = strategic_merge_patch(POD, {"metadata": {"$patch": "replace", "labels": {"z": "9"}}})
    assert out["metadata"] == {"labels": {"z": "9"}}
    with pytest.raises(ApiError) as err:
        strategic_merge_patch(POD, {"spec": {"containers": [{"image": "no-name"}]}})
    assert err.value.code == 400 and "'name'" in err.value.message


def test_json_patch_operations_and_errors():
    doc = {"a": {"b": [1, 2]}, "c": "x"}
    out = json_patch(doc, [{"op": "add", "path": "/a/b/-", "value": 3},
                           {"op": "move", "from": "/c", "path": "/d"},
                           {"op": "copy", "from": "/d", "path": "/e"},
                           {"op": "replace", "path": "/a/b/0", "value": 0},
                           {"op": "test", "path": "/e", "value": "x"},
                           {"op": "add", "path": "/f~1g", "value": True}])
    assert out == {"a": {"b": [0, 2, 3]}, "d": "x", "e": "x", "f/g": True}
    for ops, code in [([{"op": "remove", "path": "/nope"}], 400), ([{"op": "test", "path": "/c", "value": "y"}], 422),
                      ([{"op": "frobnicate", "path": "/c"}], 400), ({"op": "add"}, 400)]:
        with pytest.raises(ApiError) as err:
            json_patch(doc, ops)
        assert err.value.code == code


def test_unknown_content_type_is_415():
    with pytest.raises(ApiError) as err:
        apply_patch({}, {}, "application/yaml")
    assert err.value.code == 415
