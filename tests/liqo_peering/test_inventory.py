"""Inventory records from realistic ForeignCluster, VirtualNode, Node and Pod objects."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering.inventory import build_inventory, cluster_health, gpus_in_use
from gpu_offload.liqo_peering.render import render_html, render_table


def test_the_test_objects_are_realistic(api, liqo_schema, k8s_schema) -> None:
    liqo_schema(api.foreign_cluster("donor-a"))
    liqo_schema(api.foreign_cluster("donor-a", offloading="NotReady", message="vk down"))
    liqo_schema(api.virtual_node("donor-a-gpu", "donor-a", 4, "A100"))
    k8s_schema(api.node("donor-a-gpu", "donor-a", 4, "A100"))
    k8s_schema(api.pod("p", "donor-a-gpu", 1))


def test_health_names_the_failing_module_and_condition(api) -> None:
    assert cluster_health(api.foreign_cluster("a")) == ("healthy", "")
    health, reason = cluster_health(api.foreign_cluster("b", offloading="NotReady", message="virtual kubelet crashed"))
    assert health == "down"
    assert reason == "offloading/OffloadingVirtualNodeStatus=NotReady (virtual kubelet crashed)"
    health, reason = cluster_health(api.foreign_cluster("c", networking="Error"))
    assert (health, reason) == ("degraded", "networking/NetworkConnectionStatus=Error")
    assert cluster_health(api.foreign_cluster("d", auth="Error"))[0] == "down"
    assert cluster_health(api.foreign_cluster("e", offloading="Pending"))[0] == "degraded"


def test_a_conditions_message_is_shown_on_one_printable_line(api) -> None:
    # Liqo words a module's condition partly from the remote cluster's answers
    fc = api.foreign_cluster("b", offloading="NotReady", message="virtual kubelet\x1b[2J\r\ncrashed " + "x" * 400)
    health, reason = cluster_health(fc)
    assert health == "down" and reason.startswith("offloading/OffloadingVirtualNodeStatus=NotReady (virtual "
                                                  "kubelet [2J crashed xxx")
    assert all(c.isprintable() for c in reason) and reason.endswith("...)")


def test_disabled_offloading_module_means_down(api) -> None:
    fc = api.foreign_cluster("a")
    fc["status"]["modules"]["offloading"] = {"enabled": False}
    assert cluster_health(fc) == ("down", "offloading module disabled")


def test_in_use_counts_only_unfinished_pods_bound_to_the_node(api) -> None:
    pods = [
        api.pod("running", "vn-a", 2),
        api.pod("pending-bound", "vn-a", 1, phase="Pending"),
        api.pod("done", "vn-a", 4, phase="Succeeded"),
        api.pod("failed", "vn-a", 4, phase="Failed"),
        api.pod("unbound", None, 8, phase="Pending"),
        api.pod("other", "vn-b", 1),
    ]
    assert gpus_in_use(pods) == {"vn-a": 3, "vn-b": 1}


def test_init_container_larger_than_the_sum_counts(api) -> None:
    p = api.pod("p", "vn-a", 1)
    p["spec"]["initContainers"] = [{"name": "warm", "image": "x", "resources": {"requests": {"nvidia.com/gpu": 3}}}]
    assert gpus_in_use([p]) == {"vn-a": 3}


def test_inventory_from_api_objects(api) -> None:
    inv = build_inventory(
        [api.foreign_cluster("donor-b"), api.foreign_cluster("donor-c", networking="Pending")],
        [api.virtual_node("donor-b-gpu", "donor-b", 4, "A100"), api.virtual_node("donor-c-gpu", "donor-c", 8, "L4")],
        [
            api.node("donor-b-gpu", "donor-b", 4, "A100", **{"gpu-offload.io/gpu-memory": "80Gi"},
                     annotations={"gpu-offload.io/price-per-gpu-hour": "2.5"}),
            api.node("donor-c-gpu", "donor-c", 8, "L4", **{"gpu-offload.io/price-per-gpu-hour": "0.8"}),
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "local-worker", "labels": {}},
             "status": {"capacity": {"nvidia.com/gpu": "2"}}},
        ],
        [api.pod("a", "donor-b-gpu", 2), api.pod("b", "donor-b-gpu", 1, phase="Succeeded")],
    )
    b, c = inv.clusters
    assert (b.cluster_id, b.health, c.health) == ("donor-b", "healthy", "degraded")
    (vb,) = b.virtual_nodes
    assert (vb.name, vb.capacity, vb.allocatable, vb.in_use, vb.free) == ("donor-b-gpu", 4, 4, 2, 2)
    assert (vb.model, vb.memory, vb.price, vb.cordoned, vb.ready) == ("A100", "80Gi", 2.5, False, True)
    assert c.virtual_nodes[0].price == 0.8
    assert [vn.name for vn in inv.virtual_nodes] == ["donor-b-gpu", "donor-c-gpu"]  # local-worker is no virtual node


def test_cordon_by_label_annotation_or_kubectl_cordon(api) -> None:
    nodes = [
        api.node("n1", "a", 1, "A100", **{"gpu-offload.io/cordoned": "true"}),
        api.node("n2", "a", 1, "A100", annotations={"gpu-offload.io/cordoned": "true"}),
        api.node("n3", "a", 1, "A100", unschedulable=True),
        api.node("n4", "a", 1, "A100", ready=False),
    ]
    inv = build_inventory([api.foreign_cluster("a")], [], nodes, [])
    assert [(vn.cordoned, vn.ready) for vn in inv.virtual_nodes] == [(True, True)] * 3 + [(False, False)]


def test_virtual_node_without_node_yet_uses_quota_and_is_not_ready(api) -> None:
    inv = build_inventory([api.foreign_cluster("a")], [api.virtual_node("vn", "a", 4, "H100")], [], [])
    (vn,) = inv.virtual_nodes
    assert (vn.capacity, vn.ready, vn.model) == (4, False, "H100")


def test_orphan_virtual_node_shows_under_a_down_cluster(api) -> None:
    inv = build_inventory([], [], [api.node("vn", "ghost", 2, "A100")], [])
    (cluster,) = inv.clusters
    assert cluster.health == "down" and "no ForeignCluster with clusterID 'ghost'" in cluster.reason


def test_bad_price_is_reported_not_fatal(api) -> None:
    bad = api.node("vn-bad", "a", 2, "A100", annotations={"gpu-offload.io/price-per-gpu-hour": "cheap"})
    inv = build_inventory([api.foreign_cluster("a")], [], [bad, api.node("vn-ok", "a", 1, "A100")], [])
    assert [vn.name for vn in inv.virtual_nodes] == ["vn-ok"]
    (error,) = inv.errors
    assert "virtual node vn-bad" in error and "'cheap' is not a number" in error


def test_table_and_html(api) -> None:
    inv = build_inventory(
        [api.foreign_cluster("donor-b"), api.foreign_cluster("donor-x", offloading="NotReady", message="gone")],
        [],
        [api.node("donor-b-gpu", "donor-b", 4, "A100<script>")],
        [api.pod("a", "donor-b-gpu", 1)],
    )
    table = render_table(inv)
    lines = table.splitlines()
    assert lines[0].split() == ["CLUSTER", "HEALTH", "TRUST", "VIRTUAL", "NODE", "MODEL", "MEMORY", "FREE/ALLOC", "IN", "USE",
                                "$/GPU-H", "STATE"]
    assert lines[1].split() == ["donor-b", "healthy", "untrusted", "donor-b-gpu", "A100<script>", "?", "3/4", "1", "-", "ready"]
    assert lines[2].split()[:4] == ["donor-x", "down", "untrusted", "-"]
    assert "donor-x is down: offloading/OffloadingVirtualNodeStatus=NotReady (gone)" in table
    html = render_html(inv)
    assert "<script>" not in html and "A100&lt;script&gt;" in html
    assert html.count("<tr>") == 3


def test_no_clusters_says_what_to_do() -> None:
    assert "liqoctl peer" in render_table(build_inventory([]))


@pytest.mark.parametrize("qty", ["1k", "2", 3])
def test_quantities_parse(api, qty) -> None:
    p = api.pod("p", "vn", 1)
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = qty
    assert gpus_in_use([p])["vn"] == {"1k": 1000, "2": 2, 3: 3}[qty]


def test_records_survive_the_json_transport(api) -> None:
    import json

    from gpu_offload.liqo_peering.inventory import inventory_from_dict, inventory_to_dict

    inv = build_inventory(
        [api.foreign_cluster("donor-b"), api.foreign_cluster("donor-x", offloading="NotReady", message="gone")],
        [], [api.node("donor-b-gpu", "donor-b", 4, "A100", annotations={"gpu-offload.io/price-per-gpu-hour": "2.5"})],
        [api.pod("a", "donor-b-gpu", 1)],
    )
    wire = json.loads(json.dumps(inventory_to_dict(inv)))
    assert wire["clusters"][0]["virtual_nodes"][0]["free"] == 3
    assert inventory_from_dict(wire) == inv
    with pytest.raises(ValueError, match="does not fit ClusterRecord"):
        inventory_from_dict({"clusters": [{"cluster_id": "a"}]})


def test_cpu_and_memory_free_are_the_nodes_allocatable_minus_what_bound_pods_request(api) -> None:
    asking = api.pod("asking", "donor-a-gpu", 1)
    asking["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1500m", "memory": "16Gi"},
                                                    "limits": {"nvidia.com/gpu": "1", "memory": "20Gi"}}
    limits_only = api.pod("limits-only", "donor-a-gpu", 1)
    limits_only["spec"]["containers"][0]["resources"]["limits"].update({"cpu": "2", "memory": "8Gi"})
    finished = api.pod("finished", "donor-a-gpu", 1, phase="Succeeded")
    finished["spec"]["containers"][0]["resources"]["limits"].update({"cpu": "8", "memory": "32Gi"})
    inventory = build_inventory([api.foreign_cluster("donor-a")], [], [api.node("donor-a-gpu", "donor-a", 4, "A100")],
                                [asking, limits_only, finished])
    (record,) = inventory.virtual_nodes
    # 16 CPUs and 64Gi allocatable; a request wins over its limit, a lone limit counts, a finished pod does not
    assert record.cpu_free == 16000 - 1500 - 2000
    assert record.memory_free == (64 - 16 - 8) * 2**30
    assert record.in_use == 2


def test_a_record_without_a_node_knows_no_cpu_or_memory(api) -> None:
    inventory = build_inventory([api.foreign_cluster("donor-a")], [api.virtual_node("donor-a-gpu", "donor-a", 4, "A100")])
    (record,) = inventory.virtual_nodes
    assert record.cpu_free is None and record.memory_free is None
