"""Cluster rows from each source the panel reads: liqo_peering's inventory records and the hub service's
user-scoped JSON (as the hub's own view function writes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_offload.hub_extension.service.views import user_inventory
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord
from gpu_offload.magics.dashboard.clusters import hub_rows, inventory_rows, local_row
from gpu_offload.magics.dashboard.widget import cluster_cells

INVENTORY = Inventory((
    ClusterRecord("id-a", "donor-a", "Provider", "healthy", trusted=True, virtual_nodes=(
        VirtualNodeRecord("vn-a1", "id-a", 4, 4, 1, model="A100", price=2.5),
        VirtualNodeRecord("vn-a2", "id-a", 2, 2, 0, model="A100", price=3.0, cordoned=True),
    )),
    ClusterRecord("id-b", "donor-b", "Provider", "down", reason="offloading module: NotReady",
                  virtual_nodes=(VirtualNodeRecord("vn-b", "id-b", 8, 8, 0, model="L4", ready=False),)),
))


def test_inventory_rows_count_only_usable_nodes_and_name_why_a_cluster_is_down() -> None:
    rows = {r.key: r for r in inventory_rows(INVENTORY)}
    assert (rows["id-a"].free, rows["id-a"].total, rows["id-a"].price) == (3, 4, 2.5)  # the cordoned node is out
    assert (rows["id-b"].health, rows["id-b"].free, rows["id-b"].note) == ("down", 0, "offloading module: NotReady")
    assert "offloading module: NotReady" in cluster_cells(rows["id-b"])
    # each donor's trust, as the origin decided it (the inventory's policy), and this machine is trusted
    assert (rows["id-a"].trusted, rows["id-b"].trusted, local_row([]).trusted) == (True, False, True)
    assert "· trusted" in cluster_cells(rows["id-a"]) and "untrusted" in cluster_cells(rows["id-b"])


def test_rows_from_the_hub_services_json_match_what_the_hub_sends() -> None:
    sent = json.loads(json.dumps(user_inventory(INVENTORY)))
    rows = {r.key: r for r in hub_rows(sent)}
    assert rows["id-a"].name == "donor-a" and rows["id-a"].model == "A100"
    assert rows["id-a"].free == 3 and rows["id-a"].total is None  # the hub shows users no totals
    assert rows["id-b"].health == "down"
    assert "free 3 GPUs" in cluster_cells(rows["id-a"])
    assert (rows["id-a"].trusted, rows["id-b"].trusted) == (True, False)


def test_the_local_row_says_cpu_only_without_gpus() -> None:
    assert local_row([]).model == "CPU only" and "no GPU" in local_row([]).note
    assert (local_row(["A10", "A10"]).model, local_row(["A10", "A10"]).total) == ("A10", 2)


def test_an_unreachable_cluster_is_a_note_and_the_local_row_stays(tmp_path: Path, monkeypatch: Any) -> None:
    from gpu_offload.magics.dashboard.sources import KernelFeeds

    from gpu_offload.engine.backends import registry
    from gpu_offload.engine.runs.records import RunBook
    from gpu_offload.engine.runs.tracking import Tracker

    class Magic:
        backend, default_cluster = "auto", "auto"

        def cluster_backend(self) -> Any:
            return registry.create("kubernetes")  # as the magic starts the kernel's backend

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))  # the client reads the real env
    monkeypatch.setenv("GPU_OFFLOAD_NAMESPACE", "alice")
    env = {"GPU_OFFLOAD_NAMESPACE": "alice"}
    feeds = KernelFeeds(Magic(), env, Tracker(RunBook(tmp_path / "runs"), kernel="k"))
    rows, notes = feeds.clusters()
    assert [r.key for r in rows] == ["local"]
    assert any("could not be reached" in n and "KUBECONFIG" in n for n in notes), notes
    assert feeds.runs().runs == ()
