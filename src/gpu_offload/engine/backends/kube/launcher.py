"""Making runner pods: place the cell, offload the namespace there, create the Pod and its Secret.

Runs and sessions get a pod (a first one, or one elsewhere after a loss) through the narrow
:class:`~.run.Launcher` interface this implements, never by calling back into the backend.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes.utils import parse_quantity

from .... import images
from ....liqo_peering import environment as E
from ....liqo_peering.cache import InventoryCache
from ....liqo_peering.client import LiqoClient
from ....liqo_peering.errors import APIForbidden, NoFit
from ....liqo_peering.inventory import Inventory
from ....liqo_peering.kueue import gpu_quotas, model_clusters, queued_scheduling
from ....liqo_peering.placement import (
    POLICIES,
    TRUST_FIX,
    PlacementPolicy,
    PlacementRequest,
    place,
    place_pods,
    scheduling_fragment,
)
from ....liqo_peering.placement import NodeChoice as Where
from ....liqo_peering.rankjob import RankJobSpec, master_port, master_service, rank_job
from ....liqo_peering.settings import kernel_settings
from ....liqo_peering.specs import MAX_SECRET_BYTES, RunnerPodSpec, runner_pod, runner_secret
from ....liqo_peering.trust import apply_policy, is_trusted, trusting
from ...errors import OffloadUsageError
from ...timing import Phase
from ..base import Ranks, RunRequest, spread_refusal
from .budget import HubSpend, check_budget
from .config import KubeSettings
from .creating import PodCreates
from .explain import MEMORY_ENV, PodContext
from .follow import KUEUE_PICKS, PodFollower
from .hub_inventory import HubInventory
from .pods import PodApi
from .queueing import QueueWatch, Ticket
from .run import LaunchedJob, LaunchedPod, PodOrder
from .storage import RunStorage, Stored

DEADLINE_MARGIN = 30
"""Seconds the pod's activeDeadlineSeconds adds to --timeout: the engine interrupts first, the deadline is
the backstop for a kernel that went away."""
SETTLE_SECONDS = 150.0
"""The longest :meth:`PodLauncher.close` waits for pod creates that Ctrl-C interrupted: a create's three attempts
of at most 30 s each with their waits, then the delete of the pod it made."""


def memory_bytes(quantity: str | None) -> int:
    """``GPU_OFFLOAD_MEMORY`` in bytes for placement (0 when unset); a clear error when it is not a quantity."""
    if not quantity:
        return 0
    try:
        return int(parse_quantity(quantity))
    except ValueError:
        raise OffloadUsageError(
            f"{MEMORY_ENV}={quantity!r} is not a Kubernetes memory quantity. Nothing was launched. Set it like "
            f"`%env {MEMORY_ENV}=32Gi` (or 500Mi), or unset it for the image's default.") from None


class PodLauncher:
    """Creates runner pods for one kernel; holds what every launch shares (inventory, runner, offloading)."""

    def __init__(self, settings: KubeSettings, pods: PodApi, liqo: LiqoClient, storage: RunStorage | None,
                 runner: Path | None = None) -> None:
        self.settings = settings
        self.pods = pods
        self.liqo = liqo
        self.storage = storage
        self._runner_path = runner
        self._runner: bytes | None = None
        self.trust = trusting(settings.trusted)
        """The origin's trust, the one source for placement, runner pods and the kernel's intake."""
        self._cache: InventoryCache | HubInventory | None = None
        self.spend = HubSpend(settings.service_url, settings.hub_token) if settings.service_url else None
        """This user's spend this month, from the hub service (budget check, status, panel)."""
        self._offloaded: set[str] = set()
        self._cache_lock = threading.Lock()  # taken inside the backend's session lock when a session starts
        self._queue: QueueWatch | None = None
        self._queue_name: str | None = None
        self._queue_known = False
        self._creates = PodCreates(pods)

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
        self._creates.settle(SETTLE_SECONDS)  # a pod whose create Ctrl-C interrupted is gone once this returns
        if self._cache is not None:
            self._cache.close(timeout=1.0)
        if self._queue is not None:
            self._queue.close()

    def queue_name(self) -> str | None:
        """The LocalQueue this kernel's pods wait in, None when queueing is off; found once, at the first launch.

        ``GPU_OFFLOAD_QUEUE`` names it (the spawner sets it); unset, the one LocalQueue of the namespace. The
        namespace's LocalQueues are listed once: none, no Kueue, or no right to list them (a chart with queueing
        off grants none) all mean queueing is off, as before; several is an error naming them.
        """
        with self._cache_lock:
            if not self._queue_known:
                # read again here: a user who followed the "several LocalQueues" error set it after the start
                self._queue_name = self.settings.queue or kernel_settings().queue or self._find_queue()
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

    def where(self, placement: RunRequest, avoid: frozenset[str], memory: str | None = None) -> Where:
        """The virtual node for ``placement`` (with ``memory`` free, a quantity) from the cached inventory, then
        the namespace offloaded there."""
        return self._placed(placement, memory, False, lambda inventory, request, policy: (
            place(inventory, request, policy, avoid=set(avoid)),))[0]

    def where_pods(self, placement: RunRequest, avoid: frozenset[str], memory: str | None, ranks: Ranks,
                   cpu_only: bool = False) -> tuple[Where, ...]:
        """Where a distributed run's ``ranks.nodes`` pods of ``placement.gpus`` GPUs (each with ``memory``
        free) go, then the namespace offloaded there: one virtual node with room for all of them, or with
        ``ranks.spread`` the clusters that together have room (:func:`place_pods`).

        ``cpu_only``: the pods ask for no GPU (``--gpus 0``) and go to the node with the most CPU free
        (``placement.most_cpu_free``); without it, ``--gpus 0`` is refused by the placement request."""
        nodes = ranks.nodes

        def choose(inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy) -> tuple[Where, ...]:
            if ranks.spread:
                return place_pods(inventory, request, nodes, policy, avoid)
            whole = dataclasses.replace(request, gpus=request.gpus * nodes, memory=request.memory * nodes)
            try:
                return (place(inventory, whole, policy, avoid),)
            except NoFit as exc:
                if nodes == 1 or cpu_only:
                    raise
                raise NoFit(f"{exc}. The {nodes} pods of this run ask for {request.gpus} GPU"
                            f"{'' if request.gpus == 1 else 's'} each, all on one cluster; add --spread to let "
                            "them span clusters", exc.alternatives) from exc

        return self._placed(placement, memory, cpu_only, choose)

    def _placed(self, placement: RunRequest, memory: str | None, cpu_only: bool,
                choose: Callable[[Inventory, PlacementRequest, PlacementPolicy], tuple[Where, ...]]) -> tuple[Where, ...]:
        """Run ``choose`` on the trust-filtered inventory under the settings' policy, then offload the
        namespace to every cluster chosen."""
        request = PlacementRequest(placement.gpus, placement.gpu_model, placement.cluster or "auto",
                                   fallback_models=placement.fallback_models, memory=memory_bytes(memory),
                                   trusted_only=placement.trusted_only, cpu_only=cpu_only)
        policy = POLICIES.get(self.settings.policy)
        if policy is None:
            raise OffloadUsageError(f"placement policy {self.settings.policy!r} is unknown; use one of "
                                    f"{', '.join(POLICIES)}")
        # the hub's inventory says which clusters its chart trusts; this kernel's own policy (which the spawner
        # wrote from the same chart) decides, so placement and the intake of outputs never disagree
        inventory = apply_policy(self.inventory_cache().inventory(), self.trust)
        try:
            chosen = choose(inventory, request, policy)
        except NoFit as exc:
            if not placement.trusted_only:
                raise
            raise OffloadUsageError(
                f"Nothing was launched: {exc}. Or run this cell without --trusted-only (with the kernel's "
                "`%gpu_offload config trusted_only=False` if it is on), knowing that whoever runs the pod on an "
                "untrusted cluster sees its code and inputs.") from exc
        missing = [c.cluster_id for c in chosen if c.cluster_id not in self._offloaded]
        if missing:
            try:
                self.liqo.ensure_offloading(self.settings.namespace, missing, create=self.settings.create_offloading,
                                            timeout=self.settings.offloading_timeout)
            except APIForbidden:
                if self.settings.create_offloading:
                    raise
                # a hub user's server may not read it: the hub offloaded the namespace when the server
                # started, and if it did not, the pod's OffloadingBackOff is explained in words
            self._offloaded.update(missing)
        return chosen

    def leave(self, ticket: Ticket) -> None:
        """See :meth:`.run.Launcher.leave`."""
        if self._queue is not None:
            self._queue.forget(ticket)

    def queued(self, placement: RunRequest) -> tuple[dict[str, object], str]:
        """The scheduling fields of a pod that waits in Kueue, and its cluster when only one may take it.

        No placement: Kueue picks the flavor (donor); the pod names only its GPUs, and node affinity where the
        cell narrows the donors (``--cluster``, ``--trusted-only``, ``--gpu-model``). A request larger than
        every flavor's quota is refused here, before anything waits for ever.
        """
        self._check_gpus(placement)
        watch = self.queue_watch()
        self._check_fits(watch, placement.gpus)
        pinned = placement.cluster not in ("", "auto")
        clusters = [placement.cluster] if pinned else []
        if placement.trusted_only:
            trusted = self.trust.trusted_ids
            clusters = [c for c in clusters if c in trusted] if pinned else list(trusted)
            if not clusters:
                where = f"cluster {placement.cluster} is not trusted" if pinned else "no cluster is trusted"
                raise OffloadUsageError(f"Nothing was launched: only trusted clusters were asked for and {where}: "
                                        f"{TRUST_FIX}.")
        models = None
        if placement.gpu_model:
            wanted = [placement.gpu_model, *placement.fallback_models]
            models = model_clusters(apply_policy(self.inventory_cache().inventory(), self.trust), self.trust, wanted)
            offered = [c for c in models if not clusters or c in clusters]
            if not offered:
                where = f" among {', '.join(clusters)}" if clusters else ""
                raise OffloadUsageError(f"Nothing was launched: no donor{where} has GPU model "
                                        f"{' or '.join(wanted)}; leave out --gpu-model or name a model a donor has.")
            clusters = offered
        key = ",".join(sorted(clusters)) or "*"
        if key not in self._offloaded:
            # every donor (or the pinned ones): where the pod goes is Kueue's choice, made after this
            try:
                self.liqo.ensure_offloading(self.settings.namespace, clusters, create=self.settings.create_offloading,
                                            timeout=self.settings.offloading_timeout)
            except APIForbidden:
                if self.settings.create_offloading:
                    raise
            self._offloaded.add(key)
        return queued_scheduling(placement.gpus, clusters, models), clusters[0] if len(clusters) == 1 else KUEUE_PICKS

    def _check_fits(self, watch: QueueWatch, gpus: int) -> None:
        quotas = gpu_quotas(watch.cluster_queue() or {})
        if not quotas or gpus <= max(quotas.values()):
            return  # an unreadable ClusterQueue: Kueue says ExceedsMaxQuota itself
        largest = max(quotas, key=lambda f: quotas[f])
        raise OffloadUsageError(
            f"Nothing was launched: this cell asks for {gpus} GPUs and no flavor of ClusterQueue "
            f"{watch.cluster_queue_name} holds that many (the largest, {largest}, has a quota of "
            f"{quotas[largest]}), so Kueue would never admit it. Ask for --gpus {quotas[largest]} or fewer"
            + (", or ask your admin why every donor's quota is 0 (cordoned or lost)" if not quotas[largest] else "")
            + " (`gpu-offload queues` shows the quotas).")

    def _check_gpus(self, placement: RunRequest) -> None:
        if placement.gpus < 1:
            raise OffloadUsageError(
                f"--gpus {placement.gpus}: the kubernetes backend runs cells on donated GPUs; ask for --gpus 1 "
                "or more, or run CPU-only cells with --backend local (CPU ranks of a distributed cell, --nodes, "
                "do run here).")

    def image(self, placement: RunRequest) -> str:
        """The runner image of ``placement``: the cell's, else the configured one, else the project's runner
        for this kernel; refused before anything is created when it declares versions the kernel's variables
        cannot travel to (``gpu_offload.images``)."""
        kernel = images.kernel_versions()
        registry = self.settings.image_registry
        try:
            image = placement.image or self.settings.image or images.default_runner(kernel, registry)
        except ValueError as exc:
            raise OffloadUsageError(f"Nothing was launched: {exc}") from None
        refusal = images.check_runner(image, kernel, registry)
        if refusal:
            raise OffloadUsageError(refusal)
        return image

    def _spec(self, order: PodOrder, scheduling: dict[str, object], cluster: str, memory: str | None,
              stored: Stored | None, queue: str | None) -> RunnerPodSpec:
        timeout = order.placement.timeout
        return RunnerPodSpec(
            run_id=order.run_id, namespace=self.settings.namespace, image=self.image(order.placement),
            user=self.settings.user, kernel=self.settings.kernel, scheduling=scheduling,
            timeout=None if timeout is None or order.session else math.ceil(timeout) + DEADLINE_MARGIN,
            python=self.settings.python, session=order.session,
            env={**order.placement.env, **order.env, **self._output_format(cluster)},
            server=self.settings.server, kernel_pid=os.getpid(), metered=self.settings.metered, memory=memory,
            bundle_url=stored.url if stored else None, bundle_sha256=stored.sha256 if stored else "",
            cli=self.settings.cli,
            queue=queue,
            # a --priority without a queue is refused by runner_pod, naming the fix
            priority_class=order.placement.priority or (self.settings.priority if queue else None),
        )

    def _output_format(self, cluster_id: str) -> dict[str, str]:
        """Tell a runner on an untrusted cluster to send its outputs in the safe format (the bundle was made
        before placement); the kernel refuses a pickle from there whatever the runner sends."""
        return {} if is_trusted(cluster_id, self.trust) else {E.OUTPUT_FORMAT.name: "safe"}

    def launch(self, order: PodOrder, avoid: frozenset[str] = frozenset()) -> LaunchedPod:
        """Place, then create the Pod and its Secret; nothing is left behind if a step fails.

        ``avoid`` is non-empty for a retry elsewhere, which a cell pinned with ``--cluster`` does not get.
        """
        placement = order.placement
        self._check_gpus(placement)
        self.image(placement)
        queue = self.queue_name()
        self._check_move(placement, queue, avoid)
        runner = self.runner_bytes()
        memory = kernel_settings().memory  # as the environment holds it now: `%env` changes the next cell
        if queue:
            scheduling, cluster = self.queued(placement)
            gpus, model = placement.gpus, placement.gpu_model if not placement.fallback_models else None
        else:
            where = self.where(placement, avoid, memory)
            scheduling, cluster, gpus, model = where.scheduling_fragment(), where.cluster_id, where.gpus, where.model
        placed = time.monotonic()
        bundle, stored = order.bundle, None
        if len(bundle) + len(runner) > MAX_SECRET_BYTES:
            stored = self._store_bundle(order.run_id, bundle, len(runner))
            bundle = b""
        spec = self._spec(order, scheduling, cluster, memory, stored, queue)
        body = runner_pod(spec)
        created = self._creates.create(body)  # Ctrl-C here leaves no pod behind
        try:
            self.pods.create(runner_secret(body, created["metadata"]["uid"], runner))
        except BaseException:
            self.pods.delete_pod(body["metadata"]["name"], grace=0)
            raise
        phases = (Phase("placement", placed), Phase("pod create", time.monotonic()))
        ctx = PodContext(cluster, gpus, spec.image, memory, model)
        name = body["metadata"]["name"]
        ticket = None
        if self._queue is not None and queue:
            ticket = self._queue.track(name, f"{gpus} x {model}" if model else f"{gpus} GPU" + "s" * (gpus > 1))
        follower = PodFollower(self.pods, created, order.nonce, ctx, one_shot=not order.session,
                               watch_seconds=self.settings.watch_seconds, run_id=order.bundle_run,
                               stdin=bundle or None)
        return LaunchedPod(name, follower, ticket, phases)

    def _check_move(self, placement: RunRequest, queue: str | None, avoid: frozenset[str]) -> None:
        """A retry elsewhere (``avoid`` non-empty) is refused with queueing on and for a ``--cluster`` pin, the
        reason ending the sentence the run reports; a first launch checks the budget."""
        if avoid and queue:
            raise OffloadUsageError(f"queueing through Kueue is on (LocalQueue {queue}), so this kernel "
                                    "does not move the pod itself: Kueue picks the donor, and a pod it evicts for not "
                                    "starting is queued again once")
        if avoid and placement.cluster and placement.cluster != "auto":
            raise OffloadUsageError(f"the cell asked for --cluster {placement.cluster} (drop it to let placement "
                                    "choose)")
        if not avoid:  # a first launch; a pod moved elsewhere belongs to a cell already running
            check_budget(self.settings.budget, self.spend)

    def launch_job(self, order: PodOrder, ranks: Ranks, avoid: frozenset[str] = frozenset()) -> LaunchedJob:
        """Place a distributed run and create its Indexed Job, the Secret the Job owns, then the headless
        Service of rank 0; a failed step deletes the Job (with its pods and what it owns).

        All pods on one virtual node: ``nodes x gpus`` GPUs free there (pod-to-pod traffic stays inside one
        cluster); with ``--spread``, the clusters that together have room (:meth:`where_pods`), every pod
        allowed on all of them (the pods of an Indexed Job share one template, so the scheduler binds each
        where it fits); with ``--gpus 0`` (CPU ranks) the node with the most CPU free. With queueing on, the
        Job's Kueue labels and no placement (Kueue admits the Job as a unit). ``avoid`` is non-empty for the one
        retry elsewhere, refused as for a single cell.
        """
        placement = order.placement
        cpu_only = placement.gpus == 0
        self.image(placement)
        queue = self.queue_name()
        self._check_move(placement, queue, avoid)  # the budget too, before anything is created
        if cpu_only and queue:
            # the ClusterQueue's quotas are what picks a donor; a Job asking for no GPU would be admitted at
            # once with no flavor, i.e. no donor, and its pods would not be sent to a virtual node at all
            raise OffloadUsageError(
                f"--gpus 0 with --nodes: queueing through Kueue is on (LocalQueue {queue}), and Kueue chooses the "
                "donor by its GPU quota, which CPU ranks do not use. Nothing was launched. Ask for --gpus 1 or "
                "more per node, or try the CPU ranks with --backend local.")
        if cpu_only and ranks.spread:
            raise OffloadUsageError(
                "--spread with --gpus 0: CPU ranks go to the one virtual node with the most CPU free, so they do "
                "not span clusters. Nothing was launched. Drop --spread, or ask for --gpus 1 or more per node.")
        runner = self.runner_bytes()
        memory = kernel_settings().memory  # as the environment holds it now: `%env` changes the next cell
        if queue and ranks.spread:
            # the magic refuses it when GPU_OFFLOAD_QUEUE is set; a LocalQueue found in the namespace is known here
            raise OffloadUsageError(f"Nothing was launched: {spread_refusal(f'LocalQueue {queue}')}")
        if queue:
            scheduling, cluster = self.queued(placement)
            model = placement.gpu_model if not placement.fallback_models else None
            clusters: tuple[str, ...] = (cluster,)
        else:
            chosen = self.where_pods(placement, avoid, memory, ranks, cpu_only)
            clusters = tuple(c.cluster_id for c in chosen)
            scheduling = scheduling_fragment(clusters, placement.gpus)
            models = {c.model for c in chosen}
            model = models.pop() if len(models) == 1 and not cpu_only else None  # CPU ranks use no GPU
        # the out rank may land on any of the clusters: its outputs are trusted only when every one is
        outputs_from = next((c for c in clusters if not is_trusted(c, self.trust)), clusters[0])
        bundle, stored = order.bundle, None
        if len(bundle) + len(runner) > MAX_SECRET_BYTES:
            stored = self._store_bundle(order.run_id, bundle, len(runner))
            bundle = b""
        spec = RankJobSpec(self._spec(order, scheduling, outputs_from, memory, stored, queue), nodes=ranks.nodes,
                           procs_per_node=ranks.procs_per_node, master_port=master_port(order.run_id))
        body = rank_job(spec)
        created = self.pods.create(body)
        name = body["metadata"]["name"]
        try:
            uid = created["metadata"]["uid"]
            self.pods.create(runner_secret(body, uid, runner))
            self.pods.create(master_service(spec, uid))
        except BaseException:
            self.pods.delete_job(name, grace=0)
            raise
        return LaunchedJob(name, PodContext(" or ".join(clusters), placement.gpus, spec.pod.image, memory, model),
                           clusters, outputs_from, stdin=bundle)

    def _store_bundle(self, run_id: str, bundle: bytes, runner_size: int) -> Stored:
        if self.storage is None:
            size = len(bundle) + runner_size
            raise OffloadUsageError(
                f"This cell's inputs make a bundle of {len(bundle) / 2**20:.1f} MiB; with the runner "
                f"({size / 2**20:.1f} MiB) it is more than the kernel sends a pod directly (at most "
                f"{MAX_SECRET_BYTES / 2**20:.2f} MiB) and no object storage is configured. Nothing was "
                "launched. Set GPU_OFFLOAD_S3_BUCKET (and GPU_OFFLOAD_S3_ENDPOINT for a non-AWS store) to "
                "send large inputs through object storage, or load the data inside the cell.")
        return self.storage.upload(run_id, "bundle.pkl", bundle)
