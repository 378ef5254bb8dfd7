"""Launching runner pods and Jobs: read what a launch depends on, plan it (:mod:`.plan`), create it
(:mod:`.executor`), then follow a queued pod's place in line.

Runs and sessions get a pod or Job (a first one, or one elsewhere after a loss) through the backend's
:class:`~.host.Host` interface, which hands the request here: one path for every kind of launch.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

from .... import images
from ....liqo_peering import environment as E
from ....liqo_peering.cache import InventoryCache
from ....liqo_peering.client import LiqoClient
from ....liqo_peering.errors import GpuOffloadError
from ....liqo_peering.inventory import Inventory
from ....liqo_peering.trust import TrustPolicy
from ...errors import OffloadUsageError
from ...timing import Phase
from ..base import RunRequest
from ..hub_api import HubSpend
from .budget import read_spend
from .config import KubeSettings
from .executor import Executor
from .host import Launched
from .hub_inventory import HubInventory
from .plan import PodOrder, Situation, inventory_need, plan_launch, refuse
from .pods import PodApi
from .queueing import QueueWatch, Ticket
from .storage import RunStorage

SETTLE_SECONDS = 150.0
"""The longest :meth:`PodLauncher.close` waits for pod creates that Ctrl-C interrupted: a create's three attempts
of at most 30 s each with their waits, then the delete of the pod it made."""


class PodLauncher:
    """Launches runner pods and Jobs for one kernel; holds what every launch shares (inventory, runner, queue)."""

    def __init__(self, settings: KubeSettings, pods: PodApi, liqo: LiqoClient, storage: RunStorage | None,
                 trust: TrustPolicy, runner: Path | None = None) -> None:
        self.settings = settings
        self.pods = pods
        self.liqo = liqo
        self.trust = trust
        """The origin's trust, the one policy for placement, runner pods and the kernel's intake."""
        self._runner_path = runner
        self._runner: bytes | None = None
        self._cache: InventoryCache | HubInventory | None = None
        self.spend = HubSpend(settings.service_url, settings.hub_token) if settings.service_url else None
        """This user's spend this month, from the hub service (budget check, status, panel)."""
        self._cache_lock = threading.Lock()  # taken inside the backend's session lock when a session starts
        self._queue: QueueWatch | None = None
        self._queue_name: str | None = None
        self._queue_known = False
        self.executor = Executor(settings, pods, liqo, storage)

    def launch(self, order: PodOrder, avoid: frozenset[str] = frozenset()) -> Launched:
        """Plan ``order`` (a pod, or a distributed run's Job) on none of the ``avoid`` clusters and create it;
        raises the plan's refusal, or the failure of a step (nothing is left behind then)."""
        seen = self._situation(order, avoid)
        plan = plan_launch(order, avoid, self.settings, self.trust, seen)
        created = self.executor.execute(plan, order.bundle, self.runner_bytes())
        phases = (Phase("placement", created.placed_at), Phase("pod create", time.monotonic()))
        ticket = None
        if plan.waits_for and self._queue is not None:
            ticket = self._queue.track(created.name, plan.waits_for)
        return Launched(created.name, created.owner, plan.ctx, plan.clusters, plan.outputs_from, created.stdin,
                        phases, ticket, plan.protection)

    def _situation(self, order: PodOrder, avoid: frozenset[str]) -> Situation:
        """What planning ``order`` reads of the world. The refusals that need no cluster come first, so a
        refused launch builds no runner, reads no inventory and waits for no queue."""
        placement = order.placement
        seen = Situation(queue=self.queue_name(order.defaults.queue), kernel=images.kernel_versions(),
                         manifest=images.manifest(), kernel_pid=os.getpid(), offloaded=self.executor.offloaded,
                         memory=order.defaults.memory,
                         spend=None if avoid else read_spend(self.settings.budget, self.spend))
        refuse(order, avoid, self.settings, seen)
        return dataclasses.replace(
            seen, runner_size=len(self.runner_bytes()),
            cluster_queue=self.queue_watch().cluster_queue() if seen.queue else None,
            inventory=self._inventory(placement, seen.queue))

    def _inventory(self, placement: RunRequest, queue: str | None) -> Inventory | None:
        """The inventory planning needs, if any (``plan.inventory_need``). One read only to narrow a queued run
        of whole GPUs gives way to a kernel whose rights do not reach the cluster's nodes (a user's server without
        the hub's inventory): Kueue then places the run unnarrowed. The cache knows a refused list at once."""
        need = inventory_need(placement, queue)
        if need == "none":
            return None
        try:
            return self.inventory_cache().inventory()
        except GpuOffloadError:
            if need == "required":
                raise
            return None

    def inventory_cache(self) -> InventoryCache | HubInventory:
        """The kernel's inventory source, started on first use: the hub service's in a hub deployment (users
        may not list cluster-wide), else a watch-fed cache of the cluster."""
        with self._cache_lock:
            if self._cache is None:
                if self.settings.service_url:
                    self._cache = HubInventory(self.settings.service_url, self.settings.hub_token)
                else:
                    self._cache = InventoryCache(self.liqo).start()
            return self._cache

    def close(self) -> None:
        """Stop the inventory watch and the queue's, if they were started."""
        self.executor.settle(SETTLE_SECONDS)  # a pod whose create Ctrl-C interrupted is gone once this returns
        if self._cache is not None:
            self._cache.close(timeout=1.0)
        if self._queue is not None:
            self._queue.close()

    def queue_name(self, default: str | None = None) -> str | None:
        """The LocalQueue this kernel's pods wait in, None when queueing is off; found once, at the first launch.

        ``GPU_OFFLOAD_QUEUE`` names it (the spawner sets it; ``default``: as the run defaults of the launching run
        read it); unset, the one LocalQueue of the namespace. The
        namespace's LocalQueues are listed once: none, no Kueue, or no right to list them (a chart with queueing
        off grants none) all mean queueing is off, as before; several is an error naming them.
        """
        with self._cache_lock:
            if not self._queue_known:
                # the run's defaults, not only the settings of the start: a user who followed the "several
                # LocalQueues" refusal set it afterwards, and the next run resolves it
                self._queue_name = self.settings.queue or default or self._find_queue()
                self._queue_known = True
            return self._queue_name

    def _find_queue(self) -> str | None:
        # a server error fails this cell with it (after a few tries) and the next cell lists again
        from ....liqo_peering.queue_client import KueueClient, SeveralLocalQueues, the_local_queue

        try:
            return the_local_queue(KueueClient(self.pods.api_client), self.settings.namespace)
        except SeveralLocalQueues as exc:
            # said where the user is: a shell running `gpu-offload run`, or a notebook
            first = f"{E.QUEUE.name}={exc.names[0]}"
            who, fix = (("`gpu-offload run` cannot tell which one the script",
                         f"`export {first}` in this shell, and run the command again") if self.settings.cli else
                        ("this kernel cannot tell which one its cells", f"`%env {first}`, and run the cell again"))
            raise OffloadUsageError(f"Nothing was launched: {E.QUEUE.name} is not set and {exc}, so {who} should "
                                    f"wait in. Set it to one of them, e.g. {fix}.") from None

    def queue_watch(self) -> QueueWatch:
        """The kernel's view of its LocalQueue, started on the first queued run; says what to do when the
        LocalQueue is missing."""
        with self._cache_lock:
            if self._queue is None:
                from ....liqo_peering.queue_client import KueueClient

                name, namespace = str(self._queue_name), self.settings.namespace
                kueue = KueueClient(self.pods.api_client)
                local = kueue.local_queue(namespace, name)
                if local is None:
                    raise OffloadUsageError(
                        f"Nothing was launched: queueing through Kueue is on ({E.QUEUE.name}={name}) but namespace "
                        f"{namespace} has no LocalQueue {name}. Restarting your server makes the hub create it; "
                        f"an admin can run `gpu-offload queues sync --namespace {namespace}`.")
                cluster_queue = str((local.get("spec") or {}).get("clusterQueue") or "")
                self._queue = QueueWatch(kueue, namespace, name, cluster_queue).start()
            return self._queue

    def runner_bytes(self) -> bytes:
        """The runner zipapp that travels in every Secret (stock images need nothing installed)."""
        if self._runner is None:
            if self._runner_path is None:
                from ....runner.build import build_runner

                self._runner_path = Path(build_runner())
            self._runner = self._runner_path.read_bytes()
        return self._runner

    def leave(self, ticket: Ticket) -> None:
        """See :meth:`.host.Host.leave`."""
        if self._queue is not None:
            self._queue.forget(ticket)

