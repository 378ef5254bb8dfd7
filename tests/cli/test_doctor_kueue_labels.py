"""``gpu-offload doctor``'s Kueue label line: real Liqo (v1.2.0, tests/realcluster/test_real_liqo.py) copies every
label of an offloaded pod to the donor's pod but those its VirtualNode's offloading patch lists, and a donor
whose Kueue manages the namespace gates a pod carrying ``kueue.x-k8s.io/queue-name`` for ever."""

from __future__ import annotations

from typing import Any

from gpu_offload.cli.doctor import check_label_reflection, unreflected_kueue_labels

from ..liqo_peering.conftest import validate_liqo


def virtual_node(name: str, skipped: list[str] | None) -> dict[str, Any]:
    """A VirtualNode as Liqo's webhook leaves it: the offloading patch holds the chart's skipped labels."""
    spec: dict[str, Any] = {"clusterID": name, "createNode": True}
    if skipped is not None:
        spec["offloadingPatch"] = {"labelsNotReflected": skipped}
    obj = {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "VirtualNode",
           "metadata": {"name": name, "namespace": f"liqo-tenant-{name}"}, "spec": spec}
    validate_liqo(obj)
    return obj


def test_virtual_nodes_that_copy_the_queue_label_are_named() -> None:
    nodes = [virtual_node("donor-b", None), virtual_node("donor-a", []),
             virtual_node("donor-c", ["kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"]),
             virtual_node("donor-d", ["kueue.x-k8s.io/priority-class"])]
    assert unreflected_kueue_labels(nodes) == ["donor-a", "donor-b", "donor-d"]


def test_the_line_warns_with_the_fix_only_when_runs_are_queued() -> None:
    assert check_label_reflection(None, ["donor-a"]) is None
    warned = check_label_reflection("user-queue", ["donor-a", "donor-b"])
    assert warned is not None and warned.status == "WARN" and warned.what == "kueue"
    assert "donor-a, donor-b" in warned.text and "offloading.reflection.skip.labels" in warned.text
    ok = check_label_reflection("user-queue", [])
    assert ok is not None and ok.status == "OK"
