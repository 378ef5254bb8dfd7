"""Wires the panel to this kernel: the magic's defaults, the run book the magic publishes its runs to, the
state directory and, when a cluster is configured, the kernel's own cluster backend (its inventory, and the
user's runs it sees). The panel opens no cluster connection of its own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ...engine.backends.base import InventorySource, UserRuns
from ...engine.backends.hub_api import HubSpend
from ...engine.errors import OffloadUsageError
from ...engine.runs.listing import RunListing, cancel_elsewhere, list_runs
from ...engine.runs.records import RunEntry
from ...engine.runs.tracking import Tracker, tracker
from ...liqo_peering import environment as E
from ...liqo_peering.settings import read_kernel
from .clusters import (
    LOCAL,
    NO_CLUSTER,
    ClusterEntry,
    cluster_source,
    hub_rows,
    inventory_rows,
    local_gpu_names,
    local_row,
    read_hub_inventory,
)
from .widget import Panel, PanelActions

INVENTORY_WAIT = 5.0
"""Seconds the first refresh waits for the inventory cache to sync (later ones read it at once)."""


class KernelFeeds:
    """What the panel reads and does in this kernel."""

    def __init__(self, magic: Any, env: Mapping[str, str], runs: Tracker | None = None) -> None:
        self.magic = magic
        self.env = env
        self.settings = read_kernel(env)
        self.tracker = runs or tracker()
        self.source = cluster_source(env)
        self._gpu_names = local_gpu_names()
        self._seen = self.tracker.version
        self.user_runs: UserRuns | None = None
        """The user's runs the kernel's cluster backend sees (runner pods of every kernel, dead ones too)."""
        self._cache: InventorySource | None = None
        self._problem = ""
        service = self.settings.service_url
        self.spend = HubSpend(service, env.get("JUPYTERHUB_API_TOKEN", "")) if service else None
        """This user's GPU-hours and cost this month, shown under the clusters (the hub meters them)."""
        try:
            self._connect()
        except Exception as exc:  # noqa: BLE001 - the panel still shows the local row and this kernel's runs
            self._problem = (f"The cluster could not be reached from this kernel: {exc}. Check KUBECONFIG and "
                             f"{E.NAMESPACE.name}, then open the panel again.")

    def _connect(self) -> None:
        if self.source == "none" or not self.settings.namespace:
            return
        # the kernel's backend, as the next cell would start it: its synced inventory and its client
        backend = self.magic.cluster_backend()
        self.user_runs = backend.user_runs()
        if self.source == "kubernetes":
            self._cache = backend.inventory()

    def clusters(self) -> tuple[list[ClusterEntry], list[str]]:
        """The local row, then the donors (or how to add one)."""
        rows = [local_row(self._gpu_names)]
        if self.source == "none":
            return rows, [NO_CLUSTER]
        notes: list[str] = [self._problem] if self._problem else []
        try:
            if self.source == "hub":
                rows += hub_rows(read_hub_inventory(self.env))
            elif self._cache is not None:
                inventory = self._cache.inventory(timeout=INVENTORY_WAIT)
                rows += inventory_rows(inventory)
                notes += list(inventory.errors)
        except Exception as exc:  # noqa: BLE001 - shown in the panel; the next refresh tries again
            where = self.settings.service_url if self.source == "hub" else "the cluster"
            notes.append(f"The inventory could not be read from {where}: {exc}. The panel retries by itself.")
        if len(rows) == 1 and not notes:
            notes.append("No peered cluster lends GPUs yet: ask the admin to peer one (hub page /services/gpu-offload/).")
        if self.spend is not None:
            notes.append(self._spend_note())
        return rows, notes

    def _spend_note(self) -> str:
        assert self.spend is not None
        if self.settings.problem("monthly_budget"):
            return f"{self.settings.problem('monthly_budget')}: no budget applies until it is fixed"
        return self.spend.line(self.settings.monthly_budget)

    def runs(self) -> RunListing:
        """My runs across this user's kernels."""
        return list_runs(self.tracker.records(), self.tracker.book, self.user_runs)

    def wait_change(self, timeout: float) -> None:
        """Wait for this kernel's runs to change (or ``timeout``)."""
        self._seen = self.tracker.wait_change(self._seen, timeout)

    def choose(self, row: ClusterEntry) -> None:
        """Make ``row`` the default of the next ``%%gpu_offload`` cells."""
        if row.key == LOCAL:
            self.magic.backend, self.magic.default_cluster = "local", "auto"
        else:
            self.magic.backend, self.magic.default_cluster = "kubernetes", row.key

    def chosen(self) -> str:
        """The key of the row the next cells run on (``auto`` when placement chooses)."""
        if self.magic.backend == "local" or (self.magic.backend == "auto" and self.source == "none"):
            return LOCAL
        return str(self.magic.default_cluster)

    def cancel(self, record: RunEntry) -> str:
        """Stop a run as Ctrl-C would (this kernel's through its cancel handle); says what was done."""
        if self.tracker.cancel(record.run_id):
            return f"Interrupting run {record.run_id} (as Ctrl-C would); press cancel again to kill it."
        return cancel_elsewhere(record, self.tracker.book, self.user_runs)

    def close(self) -> None:
        """Nothing to stop: the inventory and the client are the kernel backend's and live on with it."""


def _magic(shell: Any) -> Any:
    registry = shell.magics_manager.registry
    if "GpuOffloadMagics" not in registry:
        shell.extension_manager.load_extension("gpu_offload.magics")
    return registry["GpuOffloadMagics"]


def open_panel(shell: Any = None, interval: float = 2.0) -> Panel:
    """Build the panel for this kernel, display it, and return it; its updates run in a thread."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        raise OffloadUsageError("The gpu_offload panel shows in a notebook: call panel() in a Jupyter kernel.")
    feeds = KernelFeeds(_magic(shell), os.environ)
    panel = Panel(feeds.clusters, feeds.runs, PanelActions(feeds.choose, feeds.chosen, feeds.cancel),
                  wait_change=feeds.wait_change, interval=interval, on_close=feeds.close, wake=feeds.tracker.wake)
    from IPython.display import display

    display(panel.widget)
    return panel
