"""A VirtualNode's spec.labels reach its virtual Node, as Liqo's virtual kubelet carries them (official client)."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.labels import label_patch, liqo_owned

from ...origins import TWO_A100

origin = TWO_A100.fixture()
core, custom = fixtures.core, fixtures.custom

VN = ("offloading.liqo.io", "v1beta1")
MODEL = "gpu-offload.io/gpu-model"
PRICE = "gpu-offload.io/price-per-gpu-hour"
CORDONED = "gpu-offload.io/cordoned"


def _patch_vnode_labels(custom: Any, cluster: str, labels: dict[str, str | None]) -> None:
    custom.patch_namespaced_custom_object(*VN, f"liqo-tenant-{cluster}", "virtualnodes", f"{cluster}-gpu",
                                          {"spec": {"labels": labels}})


def _node_labels(core: Any, name: str) -> dict[str, str]:
    return dict(core.read_node(name).metadata.labels or {})


def test_a_new_model_and_price_on_the_virtual_node_reach_the_node(core: Any, custom: Any) -> None:
    try:
        # the remote-cluster-id in the same patch must not reach the Node: the virtual kubelet owns it
        _patch_vnode_labels(custom, "donor-1", {MODEL: "H100", PRICE: "3.5", "liqo.io/remote-cluster-id": "evil"})
        labels = wait_until(lambda: (lb := _node_labels(core, "donor-1-gpu")).get(MODEL) == "H100" and lb,
                            "donor-1-gpu to carry the VirtualNode's new model")
        assert labels[PRICE] == "3.5"
        assert labels["liqo.io/remote-cluster-id"] == "donor-1" and labels["liqo.io/type"] == "virtual-node"
        assert _node_labels(core, "donor-2-gpu")[MODEL] == "A100"  # only the matching Node changed
        node = core.list_node(label_selector=f"{MODEL}=H100").items
        assert [n.metadata.name for n in node] == ["donor-1-gpu"]  # what a scheduler selecting on it sees
    finally:
        # as seeded: the model and price back, the key the seed did not set gone again (a shared origin)
        _patch_vnode_labels(custom, "donor-1", {MODEL: "A100", PRICE: "2.00", "liqo.io/remote-cluster-id": None})
    wait_until(lambda: _node_labels(core, "donor-1-gpu").get(MODEL) == "A100", "the model to come back")


def test_a_key_removed_from_the_virtual_node_leaves_the_node_but_others_labels_stay(core: Any, custom: Any) -> None:
    core.patch_node("donor-2-gpu", {"metadata": {"labels": {"team": "ml"}}})
    try:
        _patch_vnode_labels(custom, "donor-2", {CORDONED: "true"})
        wait_until(lambda: _node_labels(core, "donor-2-gpu").get(CORDONED) == "true", "the cordon label on the Node")
        _patch_vnode_labels(custom, "donor-2", {CORDONED: None, PRICE: "9"})
        labels = wait_until(lambda: (lb := _node_labels(core, "donor-2-gpu")).get(PRICE) == "9" and lb,
                            "the new price on the Node")
        assert CORDONED not in labels  # it was put there from spec.labels, so it goes with it
        assert labels["team"] == "ml"  # set on the Node by someone else: not the propagation's to remove
        assert labels[MODEL] == "A100"
    finally:
        _patch_vnode_labels(custom, "donor-2", {CORDONED: None, PRICE: "2.25"})
        core.patch_node("donor-2-gpu", {"metadata": {"labels": {"team": None}}})
    wait_until(lambda: _node_labels(core, "donor-2-gpu").get(PRICE) == "2.25", "the price to come back")


def test_a_node_registered_after_its_virtual_node_gets_the_labels(core: Any, custom: Any) -> None:
    name = "donor-1-extra"
    vnode = {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "VirtualNode",
             "metadata": {"name": name, "labels": {"liqo.io/remote-cluster-id": "donor-1"}},
             "spec": {"clusterID": "donor-1", "createNode": True, "labels": {MODEL: "L4", PRICE: "0.8"}}}
    custom.create_namespaced_custom_object(*VN, "liqo-tenant-donor-1", "virtualnodes", vnode)
    try:
        core.create_node({"metadata": {"name": name, "labels": {"liqo.io/type": "virtual-node"}}})
        labels = wait_until(lambda: (lb := _node_labels(core, name)).get(MODEL) == "L4" and lb,
                            "the late Node to get the VirtualNode's labels")
        assert labels[PRICE] == "0.8" and labels["liqo.io/type"] == "virtual-node"
    finally:  # Liqo deletes a deleted VirtualNode's Node before the VirtualNode goes
        custom.delete_namespaced_custom_object(*VN, "liqo-tenant-donor-1", "virtualnodes", name)
        wait_until(lambda: name not in [n.metadata.name for n in core.list_node().items], "the Node to go with it")


@pytest.mark.parametrize(("key", "owned"), [
    ("liqo.io/type", True), ("virtual-node.liqo.io/not-allowed", True),
    ("gpu-offload.io/gpu-model", False), ("team", False), ("notliqo.io/x", False),
])
def test_liqo_keys_belong_to_the_virtual_kubelet(key: str, owned: bool) -> None:
    assert liqo_owned(key) is owned


def test_the_patch_removes_only_propagated_keys_and_never_liqo_ones() -> None:
    current = {"liqo.io/type": "virtual-node", MODEL: "A100", "team": "ml", CORDONED: "true"}
    wanted = {MODEL: "H100", "liqo.io/type": "other"}
    assert label_patch(wanted, current, {MODEL, CORDONED, "liqo.io/type"}) == {MODEL: "H100", CORDONED: None}
