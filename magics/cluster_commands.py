"""What the ``%gpu_offload clusters`` and ``%gpu_offload cleanup`` line magics show for a cluster backend.

The magic names the backend and never imports it: what these commands need of it is :class:`ClusterBackend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..engine.backends.base import InventorySource
from ..liqo_peering.inventory import Inventory
from ..liqo_peering.render import render_html, render_table


class ClusterBackend(Protocol):
    """A backend that runs on a cluster: its settings name the user, kernel and namespace; it cleans up."""

    settings: Any

    def inventory(self) -> InventorySource: ...

    def cleanup(self, everything_of_user: bool = False) -> list[str]: ...


@dataclass(frozen=True)
class ClustersView:
    """The peered clusters and their GPUs: a table in a notebook, plain text in a terminal."""

    inventory: Inventory

    def _repr_html_(self) -> str:
        return render_html(self.inventory)

    def __repr__(self) -> str:
        return render_table(self.inventory)


def clusters(backend: ClusterBackend) -> ClustersView:
    """The inventory from this kernel's cache (the first call lists, later ones cost no request)."""
    return ClustersView(backend.inventory().inventory())


def cleanup(backend: ClusterBackend, everything_of_user: bool) -> str:
    """Delete leftover runner pods and Secrets (this kernel's, or with ``--all`` every kernel's of this user)."""
    removed = backend.cleanup(everything_of_user)
    whose = f"of user {backend.settings.user}" if everything_of_user else f"of kernel {backend.settings.kernel}"
    if not removed:
        return f"nothing to clean up {whose} in namespace {backend.settings.namespace}"
    return f"deleted {len(removed)} object(s) {whose} in {backend.settings.namespace}: {', '.join(sorted(removed))}"
