"""Placement over 1,000 virtual nodes in 100 clusters (goal: at most 10 ms per placement).

Builds the inventory from API-shaped dicts (as the cache holds them), then times ``place`` with each policy,
the no-fit path (which also composes the message), the inventory build and the table render. Prints a
Markdown table with the machine and the date. Run: ``.venv/bin/python bench/bench_placement.py``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable

from gpu_offload.liqo_peering.errors import NoFit
from gpu_offload.liqo_peering.inventory import Inventory, build_inventory
from gpu_offload.liqo_peering.placement import BinPack, FirstFit, MostFree, PlacementRequest, place
from gpu_offload.liqo_peering.render import render_table
from harness import Run, percentile, timed  # bench/harness.py: the script's folder is on sys.path

CLUSTERS, NODES_PER_CLUSTER, PODS = 100, 10, 4000
MODELS = ("A100", "H100", "L4", "T4")
GOAL_MS = 10.0


def api_objects(rng: random.Random) -> tuple[list[dict], list[dict], list[dict]]:
    """ForeignClusters, virtual Nodes and GPU pods shaped as the API returns them."""
    fcs, nodes, pods = [], [], []
    for c in range(CLUSTERS):
        cid = f"donor-{c:03d}"
        ok = {"enabled": True, "conditions": [{"type": "OffloadingVirtualNodeStatus", "status": "Ready"}]}
        fcs.append({"metadata": {"name": cid}, "spec": {"clusterID": cid},
                    "status": {"role": "Provider", "modules": {"offloading": ok, "authentication": ok, "networking": ok}}})
        for n in range(NODES_PER_CLUSTER):
            labels = {"liqo.io/type": "virtual-node", "liqo.io/remote-cluster-id": cid,
                      "gpu-offload.io/gpu-model": rng.choice(MODELS),
                      "gpu-offload.io/price-per-gpu-hour": f"{rng.uniform(0.5, 4):.2f}"}
            if rng.random() < 0.05:
                labels["gpu-offload.io/cordoned"] = "true"
            gpus = str(rng.choice((4, 8, 16)))
            nodes.append({"metadata": {"name": f"{cid}-gpu-{n}", "labels": labels},
                          "status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus},
                                     "conditions": [{"type": "Ready", "status": "True"}]}})
    for p in range(PODS):
        node = rng.choice(nodes)["metadata"]["name"]
        pods.append({"metadata": {"name": f"p{p}", "namespace": "u"}, "spec": {"nodeName": node, "containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}})
    return fcs, nodes, pods


def expect_no_fit(inventory: Inventory) -> None:
    try:
        place(inventory, PlacementRequest(64, "A100"))
    except NoFit:
        return
    raise AssertionError("64 GPUs on one node should not fit")


def main() -> int:
    rng = random.Random(5)
    fcs, nodes, pods = api_objects(rng)
    inventory = build_inventory(fcs, [], nodes, pods)
    assert len(inventory.virtual_nodes) == CLUSTERS * NODES_PER_CLUSTER
    request = PlacementRequest(2, "A100", fallback_models=("H100",))
    cases: list[tuple[str, Callable[[], object], int]] = [
        ("place most-free (A100, fallback H100)", lambda: place(inventory, request, MostFree()), 200),
        ("place bin-pack", lambda: place(inventory, request, BinPack()), 200),
        ("place first-fit", lambda: place(inventory, request, FirstFit()), 200),
        ("place any model, cluster=donor-050", lambda: place(inventory, PlacementRequest(1, cluster="donor-050")), 200),
        ("no fit (64 x A100) + message", lambda: expect_no_fit(inventory), 200),
        (f"build_inventory ({len(nodes)} nodes, {PODS} pods)", lambda: build_inventory(fcs, [], nodes, pods), 20),
        ("render_table", lambda: render_table(inventory), 20),
    ]
    run = Run("placement", "Placement over 1,000 virtual nodes in 100 clusters")
    run.note(f"inventory: {CLUSTERS} clusters, {len(nodes)} virtual nodes; goal: placement <= {GOAL_MS:g} ms")
    worst_wall = worst_cpu = 0.0
    for name, fn, repeat in cases:
        fn()  # warm up
        wall, cpu = timed(fn, repeat)
        run.figure(f"{name} wall", wall, "ms")
        run.figure(f"{name} CPU", cpu, "ms")
        if name.startswith(("place", "no fit")):
            worst_wall = max(worst_wall, percentile(wall, 0.95))
            worst_cpu = max(worst_cpu, percentile(cpu, 0.95))
    for what, worst in (("wall", worst_wall), ("CPU", worst_cpu)):
        run.goal(f"worst placement {what} p95", worst, GOAL_MS)
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
