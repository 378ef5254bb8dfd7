"""Planning a launch: what a run's pod (or distributed run's Job) will be, decided without touching anything.

:func:`plan_launch` turns a run's :class:`PodOrder`, the kernel's settings and trust policy, and what
the backend read of the world beforehand (a :class:`Situation`: the queue, the inventory, the runner's size,
the user's spend) into a :class:`LaunchPlan`: wait in Kueue or go to a chosen virtual node, the trust of the
cluster and so the format outputs come back in, the bundle inline or in object storage, and the objects to
create (a Pod, or an Indexed Job, then the Secret and the Job's Service). Every refusal of a launch is made
here, once, as an :class:`~...errors.OffloadUsageError` naming the fix (a placement that finds no room raises
the placement's own error, which the backend words). :mod:`.executor` then creates what the plan says.

No I/O here: whatever the plan depends on is in its arguments, so every decision is tested with literal
data (tests/engine/kube/test_plan.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes.utils import parse_quantity

from .... import images
from ....liqo_peering import environment as E
from ....liqo_peering.errors import NoFit
from ....liqo_peering.inventory import Inventory
from ....liqo_peering.kueue import gpu_quotas, model_clusters, queued_scheduling
from ....liqo_peering.placement import (
    POLICIES,
    TRUST_FIX,
    NodeChoice,
    PlacementPolicy,
    PlacementRequest,
    place,
    place_one,
    place_pods,
    price_key,
    scheduling_fragment,
)
from ....liqo_peering.rankjob import RankJobSpec, master_port, master_service, rank_job
from ....liqo_peering.settings import RunDefaults
from ....liqo_peering.shares import ClusterShare, cluster_shares, queued_ask, queued_whole
from ....liqo_peering.sharing import FractionRequest, ResourceAsk
from ....liqo_peering.specs import MAX_SECRET_BYTES, RunnerPodSpec, runner_pod, runner_secret
from ....liqo_peering.trust import TrustPolicy, apply_policy, is_trusted
from ...errors import OffloadUsageError
from ..base import Ranks, RunRequest
from .budget import SpendReading, budget_refusal
from .config import KubeSettings
from .explain import MEMORY_ENV, PodContext, front_words
from .follow import KUEUE_PICKS
from .protection import Protection, session_priority

DEADLINE_MARGIN = 30
"""Seconds the pod's activeDeadlineSeconds adds to --timeout: the engine interrupts first, the deadline is
the backstop for a kernel that went away."""
BUNDLE_OBJECT = "bundle.pkl"
"""The object a bundle too large for the pod's stdin and Secret is stored as, under the run's id."""
EITHER = " or "
"""Joins the clusters a spread Job's pods may run on into its ``ctx.cluster`` (``donor-1 or donor-2``)."""


@dataclass(frozen=True)
class PodOrder:
    """What a runner pod (or a distributed run's Job) is made from; a run or session keeps it to ask for its
    pods again elsewhere."""

    run_id: str
    nonce: str
    placement: RunRequest
    """Where and with what (``placement.ranks``: a distributed run's Job)."""
    bundle: bytes = b""
    """The pickled bundle (empty for a session, whose runners read bundles on stdin)."""
    session: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment besides the placement's."""
    bundle_run: str | None = None
    """The run id inside ``bundle`` (its frames carry it; a retry elsewhere keeps it); ``None`` for a session."""
    defaults: RunDefaults = field(default_factory=RunDefaults)
    """What the run gets where it does not say (its runner's memory, the LocalQueue): ``run_defaults`` resolved
    once when the run or session starts (``Host.run_defaults``), so its relaunches keep them."""
    preimport: tuple[str, ...] = ()
    """Modules its runner imports while the bundle is on its way (``Job.preimport``)."""


@dataclass(frozen=True)
class Situation:
    """What the backend read before planning one launch: the only inputs besides the order and settings."""

    queue: str | None
    """The LocalQueue the kernel's pods wait in; None: queueing is off."""
    kernel: images.Versions
    """This kernel's Python, cloudpickle and torch (the runner image must carry the same)."""
    manifest: images.Manifest
    """The project's runner images and what each declares."""
    runner_size: int = 0
    """Bytes of the runner zipapp that travels in the Secret."""
    kernel_pid: int = 0
    memory: str | None = None
    """``GPU_OFFLOAD_MEMORY`` as set now (a quantity; None: the image's default)."""
    inventory: Inventory | None = None
    """The donors as the inventory source says; needed when :func:`inventory_need` says so."""
    cluster_queue: Mapping[str, Any] | None = None
    """The ClusterQueue behind the LocalQueue as last seen (its quotas); None when unreadable."""
    offloaded: frozenset[str] = frozenset()
    """What the namespace was already offloaded to by this kernel: cluster ids, and queued runs' keys."""
    spend: SpendReading | None = None
    """The user's spend this month, read for a first launch when a monthly budget is set."""


InventoryNeed = Literal["none", "narrow", "required"]
"""What planning a run needs of the inventory: nothing; only to narrow a queued run of whole GPUs to the donors
that lend whole GPUs (Kueue can place it unnarrowed when the inventory cannot be read); or the inventory itself."""


def inventory_need(placement: RunRequest, queue: str | None) -> InventoryNeed:
    """Whether planning ``placement`` reads the inventory: to place it, or to narrow a queued run to a model or
    to the donors that lend part of a GPU in the same units (required); or for whole GPUs to the donors that
    lend whole GPUs (``shares.queued_whole``; narrowing only)."""
    if queue is None or placement.gpu_model or fraction_of(placement) is not None:
        return "required"
    return "narrow" if placement.gpus > 0 else "none"


def fraction_of(placement: RunRequest) -> FractionRequest | None:
    """The part of one GPU a run asks for (``--gpus 0.5``, ``--gpu-memory``), None for whole GPUs."""
    if placement.fraction is None and placement.gpu_memory is None:
        return None
    return FractionRequest(placement.fraction if placement.fraction is not None else 1.0, placement.gpu_memory)


@dataclass(frozen=True)
class Offloading:
    """The namespace's offloading a launch needs first (``LiqoClient.ensure_offloading``)."""

    clusters: tuple[str, ...]
    """The clusters to offload to (none: every donor, for a queued run Kueue places)."""
    marks: tuple[str, ...]
    """What to remember as done once it is (cluster ids, or a queued run's key)."""


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one launch does, decided before anything is done."""

    run_id: str
    kind: Literal["Pod", "Job"]
    queue: str | None
    """The LocalQueue the pod or Job waits in; None: placed by this kernel."""
    clusters: tuple[str, ...]
    """Where the pods may run: the chosen cluster(s), or for a queued run the one it is narrowed to, else
    ``KUEUE_PICKS``."""
    ctx: PodContext
    """Where the pods were sent and what they ask for, as the run's sentences name it."""
    outputs_from: str
    """The cluster whose trust decides what comes back: the one, or the first untrusted of several."""
    trusted: bool
    """Whether outputs may come back as pickles (else the runner sends the safe format)."""
    offloading: Offloading | None
    """The namespace's offloading to ensure first; None: already done."""
    stored: bool
    """The bundle is stored in object storage (too large for stdin and the Secret), not sent on stdin."""
    pod: RunnerPodSpec
    """The runner pod (each pod of a Job); ``bundle_url`` is filled in once the bundle is stored."""
    job: RankJobSpec | None = None
    """A distributed run's Indexed Job as ``rank_job`` makes it (its ``pod`` is :attr:`pod`); None: one pod."""
    waits_for: str = ""
    """What a queued pod or Job waits for, as its place in line says it (``2 x A100``, ``2 pods of 1 GPU``);
    empty: no tracking."""
    protection: Protection | None = None
    """A session pod raised to the protected class once it runs and lowered to its own later (``.protection``)."""

    def owner(self, bundle_url: str | None = None, bundle_sha256: str = "") -> dict[str, Any]:
        """The first object to create: the Pod, or the Job (the stored bundle's URL and digest, if stored)."""
        pod = dataclasses.replace(self.pod, bundle_url=bundle_url, bundle_sha256=bundle_sha256) if self.stored \
            else self.pod
        return runner_pod(pod) if self.job is None else rank_job(dataclasses.replace(self.job, pod=pod))

    def owned(self, owner: Mapping[str, Any], uid: str, runner: bytes) -> list[dict[str, Any]]:
        """The objects the created ``owner`` (with ``uid``) owns, in creation order: the runner's Secret, and
        a Job's headless Service of rank 0."""
        objects = [runner_secret(owner, uid, runner)]
        if self.job is not None:
            objects.append(master_service(self.job, uid))
        return objects


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


# --- refusals ---------------------------------------------------------------------------------------------


def runner_image(placement: RunRequest, settings: KubeSettings, seen: Situation) -> str:
    """The runner image: the cell's, else the configured one, else the project's runner for this kernel;
    refused when it declares versions the kernel's variables cannot travel to (``gpu_offload.images``)."""
    registry = settings.image_registry
    try:
        image = placement.image or settings.image or images.default_runner(seen.kernel, registry, seen.manifest)
    except ValueError as exc:
        raise OffloadUsageError(f"Nothing was launched: {exc}") from None
    refusal = images.check_runner(image, seen.kernel, registry, seen.manifest)
    if refusal:
        raise OffloadUsageError(refusal)
    return image


def refuse_no_gpus(placement: RunRequest) -> None:
    """A runner pod asks for GPUs; CPU-only cells belong to the local backend."""
    if placement.gpus < 1:
        raise OffloadUsageError(
            f"--gpus {placement.gpus}: the kubernetes backend runs cells on donated GPUs; ask for --gpus 1 "
            "or more, or run CPU-only cells with --backend local (CPU ranks of a distributed cell, --nodes, "
            "do run here).")


def refuse_move(placement: RunRequest, queue: str | None, avoid: frozenset[str]) -> None:
    """A retry elsewhere (``avoid`` non-empty) is refused with queueing on and for a ``--cluster`` pin, the
    reason ending the sentence the run reports."""
    if avoid and queue:
        raise OffloadUsageError(f"queueing through Kueue is on (LocalQueue {queue}), so this kernel "
                                "does not move the pod itself: Kueue picks the donor, and a pod it evicts for not "
                                "starting is queued again once")
    if avoid and placement.cluster and placement.cluster != "auto":
        raise OffloadUsageError(f"the cell asked for --cluster {placement.cluster} (drop it to let placement "
                                "choose)")


def refuse_ranks(placement: RunRequest, ranks: Ranks, queue: str | None) -> None:
    """What a distributed run may not combine: CPU ranks with queueing or ``--spread``, ``--spread`` with
    queueing."""
    cpu_only = placement.gpus == 0
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
    if queue and ranks.spread:
        raise OffloadUsageError(
            f"Nothing was launched: --spread: queueing is on (LocalQueue {queue}), and Kueue admits the nodes of a run "
            "as one pod set with one flavor, i.e. one donor, so they cannot span donors. Leave out --spread, or turn "
            "queueing off for this kernel.")


def refuse_unfit(gpus: int, cluster_queue: Mapping[str, Any] | None, queue: str) -> None:
    """A request larger than every flavor's quota, which Kueue would never admit."""
    quotas = gpu_quotas(cluster_queue or {})
    if not quotas or gpus <= max(quotas.values()):
        return  # an unreadable ClusterQueue: Kueue says ExceedsMaxQuota itself
    largest = max(quotas, key=lambda f: quotas[f])
    name = ((cluster_queue or {}).get("metadata") or {}).get("name") or f"behind LocalQueue {queue}"
    raise OffloadUsageError(
        f"Nothing was launched: this cell asks for {gpus} GPUs and no flavor of ClusterQueue "
        f"{name} holds that many (the largest, {largest}, has a quota of "
        f"{quotas[largest]}), so Kueue would never admit it. Ask for --gpus {quotas[largest]} or fewer"
        + (", or ask your admin why every donor's quota is 0 (cordoned or lost)" if not quotas[largest] else "")
        + " (`gpu-offload queues` shows the quotas).")


def stores_bundle(order: PodOrder, runner_size: int, settings: KubeSettings) -> bool:
    """Whether the bundle goes to object storage (too large to send the pod directly); refused without one."""
    if len(order.bundle) + runner_size <= MAX_SECRET_BYTES:
        return False
    if settings.storage is None:
        size = len(order.bundle) + runner_size
        raise OffloadUsageError(
            f"This cell's inputs make a bundle of {len(order.bundle) / 2**20:.1f} MiB; with the runner "
            f"({size / 2**20:.1f} MiB) it is more than the kernel sends a pod directly (at most "
            f"{MAX_SECRET_BYTES / 2**20:.2f} MiB) and no object storage is configured. Nothing was "
            "launched. Set GPU_OFFLOAD_S3_BUCKET (and GPU_OFFLOAD_S3_ENDPOINT for a non-AWS store) to "
            "send large inputs through object storage, or load the data inside the cell.")
    return True


# --- where the pods go ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """Where a launch's pods go, as placement or the queue decided it."""

    scheduling: dict[str, Any]
    """The pod's scheduling fragment (resources, tolerations, affinity)."""
    clusters: tuple[str, ...]
    gpus: int
    """GPUs of the one pod (a Job's pods: GPUs per pod)."""
    model: str | None
    offloading: Offloading | None
    ask: ResourceAsk | None = None
    """Part of a GPU: what the donor grants it in, the share held and the isolation (``sharing.resource_ask``)."""
    shares: tuple[ClusterShare, ...] = ()
    """Part of a GPU: per cluster the pod may land on, what it holds there and the warning when that donor
    does not isolate GPU memory (``shares.cluster_shares``)."""
    may_run_on: tuple[str, ...] = ()
    """A queued launch: the donors Kueue may admit it to as the inventory lists them (empty: not known). Their
    trust decides the output format: a trusted donor's pickles come back even when Kueue picks among several."""


def queued_where(placement: RunRequest, queue: str, seen: Situation, trust: TrustPolicy,
                 inventory: Inventory | None) -> Where:
    """A pod or Job that waits in Kueue: no placement (Kueue picks the flavor, i.e. the donor); node affinity
    only where the cell narrows the donors (``--cluster``, ``--trusted-only``, ``--gpu-model``)."""
    if fraction_of(placement) is None:  # a part of a GPU counts against the shared resources' quotas instead
        refuse_unfit(placement.gpus, seen.cluster_queue, queue)
    pinned = placement.cluster not in ("", "auto")
    clusters = [placement.cluster] if pinned else []
    if placement.trusted_only:
        trusted = trust.trusted_ids
        clusters = [c for c in clusters if c in trusted] if pinned else list(trusted)
        if not clusters:
            where = f"cluster {placement.cluster} is not trusted" if pinned else "no cluster is trusted"
            raise OffloadUsageError(f"Nothing was launched: only trusted clusters were asked for and {where}: "
                                    f"{TRUST_FIX}.")
    models = None
    if placement.gpu_model:
        assert inventory is not None, "inventory_need() said the inventory is read for a model"
        wanted = [placement.gpu_model, *placement.fallback_models]
        models = model_clusters(inventory, trust, wanted)
        offered = [c for c in models if not clusters or c in clusters]
        if not offered:
            where = f" among {', '.join(clusters)}" if clusters else ""
            raise OffloadUsageError(f"Nothing was launched: no donor{where} has GPU model "
                                    f"{' or '.join(wanted)}; leave out --gpu-model or name a model a donor has.")
        clusters = offered
    fraction, ask = fraction_of(placement), None
    shares: tuple[ClusterShare, ...] = ()
    if fraction is None and placement.gpus > 0 and inventory is not None:
        # a flavor counts nvidia.com/gpu as its nodes offer it: shares or an isolator's slots are not whole GPUs
        try:
            whole = queued_whole(inventory.virtual_nodes, placement.gpus, clusters, wanted_models(placement),
                                 price_key, single=placement.ranks is None)
        except NoFit as exc:
            raise OffloadUsageError(f"Nothing was launched: {exc}") from None
        if whole.ask is not None:
            ask = whole.ask
            shares = cluster_shares(inventory.virtual_nodes, FractionRequest(1.0), whole.clusters,
                                    wanted_models(placement), usable(placement, trust))
        if whole.clusters:
            clusters = list(whole.clusters)
            models = {c: m for c, m in models.items() if c in clusters} if models is not None else None
    elif fraction is not None:  # part of a GPU: in the units of the donors Kueue may choose among
        assert inventory is not None, "inventory_need() said the inventory is read for a fraction"
        try:
            ask, shared = queued_ask(inventory.virtual_nodes, fraction, clusters, wanted_models(placement),
                                     price_key)
        except NoFit as exc:
            raise OffloadUsageError(f"Nothing was launched: {exc}") from None
        # Kueue may admit the pod on any of them, and they may isolate differently (MPS and time-slicing
        # shares can be the same resource): the notice is chosen once Kueue has picked (``admitted_context``)
        shares = cluster_shares(inventory.virtual_nodes, fraction, shared, wanted_models(placement),
                                usable(placement, trust))
        clusters = list(shared)
        models = {c: m for c, m in models.items() if c in shared} if models is not None else None
    key = ",".join(sorted(clusters)) or "*"
    # every donor (or the narrowed ones): where the pod goes is Kueue's choice, made after this
    offloading = None if key in seen.offloaded else Offloading(tuple(clusters), (key,))
    model = placement.gpu_model if not placement.fallback_models else None
    # the kernel still judges the outputs by the cluster the run ends up on (a donor peered after this plan)
    may_run_on = tuple(clusters) or (tuple(c.cluster_id for c in inventory.clusters) if inventory else ())
    return Where(queued_scheduling(placement.gpus, clusters, models, ask.limits if ask else None),
                 (clusters[0] if len(clusters) == 1 else KUEUE_PICKS,), placement.gpus, model, offloading, ask,
                 shares, may_run_on)


def wanted_models(placement: RunRequest) -> list[str | None]:
    """The GPU models a cell accepts, in order (None: any)."""
    return [placement.gpu_model, *placement.fallback_models]


def usable(placement: RunRequest, trust: TrustPolicy) -> tuple[str, ...]:
    """The clusters an isolation warning may send the user to: the trusted ones under --trusted-only, else all."""
    return tuple(trust.trusted_ids) if placement.trusted_only else ()


Choose = Callable[[Inventory, PlacementRequest, PlacementPolicy], tuple[NodeChoice, ...]]


def _chooser(ranks: Ranks | None, avoid: frozenset[str], cpu_only: bool) -> Choose:
    """One virtual node for a cell; for a distributed run one with room for every pod, or with ``--spread``
    the clusters that together have room (:func:`place_pods`)."""
    if ranks is None:
        return lambda inventory, request, policy: (place_one(inventory, request, policy, avoid=set(avoid)),)
    nodes = ranks.nodes

    def choose(inventory: Inventory, request: PlacementRequest, policy: PlacementPolicy) -> tuple[NodeChoice, ...]:
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

    return choose


def placement_request(placement: RunRequest, memory: str | None) -> PlacementRequest:
    """What placement is asked for a run's (or each rank's) pod: its GPUs, model, cluster, memory and trust."""
    return PlacementRequest(placement.gpus, placement.gpu_model, placement.cluster or "auto",
                            fallback_models=placement.fallback_models, memory=memory_bytes(memory),
                            trusted_only=placement.trusted_only,
                            cpu_only=placement.ranks is not None and placement.gpus == 0,
                            fraction=fraction_of(placement))


def choose_nodes(placement: RunRequest, inventory: Inventory, policy: str, memory: str | None,
                 avoid: frozenset[str] = frozenset()) -> tuple[NodeChoice, ...]:
    """The virtual node(s) the kernel places ``placement``'s pod (a distributed run's pods) on under ``policy``,
    in the trust-applied ``inventory``, on none of the ``avoid`` clusters: the one fit rule of a launch and of a
    drain's move (``drain.drain_step``). Raises the placement's error when nothing fits."""
    chosen_policy = POLICIES.get(policy)
    if chosen_policy is None:
        raise OffloadUsageError(f"placement policy {policy!r} is unknown; use one of {', '.join(POLICIES)}")
    request = placement_request(placement, memory)
    return _chooser(placement.ranks, avoid, request.cpu_only)(inventory, request, chosen_policy)


def placed_where(placement: RunRequest, avoid: frozenset[str], seen: Situation, settings: KubeSettings,
                 trust: TrustPolicy, inventory: Inventory) -> Where:
    """The virtual node(s) from the trust-applied ``inventory`` under the settings' policy, and the namespace's
    offloading to those not offloaded yet. ``--gpus 0`` (CPU ranks) goes to the node with the most CPU free."""
    ranks = placement.ranks
    cpu_only = ranks is not None and placement.gpus == 0
    try:
        chosen = choose_nodes(placement, inventory, settings.policy, seen.memory, avoid)
    except NoFit as exc:
        if not placement.trusted_only:
            raise
        raise OffloadUsageError(
            f"Nothing was launched: {exc}. Or run this cell without --trusted-only (with the kernel's "
            "`%gpu_offload config trusted_only=False` if it is on), knowing that whoever runs the pod on an "
            "untrusted cluster sees its code and inputs.") from exc
    missing = tuple(c.cluster_id for c in chosen if c.cluster_id not in seen.offloaded)
    offloading = Offloading(missing, missing) if missing else None
    clusters = tuple(c.cluster_id for c in chosen)
    if ranks is None:
        one = chosen[0]
        shares = cluster_shares(inventory.virtual_nodes, fraction_of(placement), (one.cluster_id,),
                                wanted_models(placement), usable(placement, trust), one.ask) if one.ask else ()
        return Where(one.scheduling_fragment(), clusters, one.gpus, one.model, offloading, one.ask, shares)
    models = {c.model for c in chosen}
    model = models.pop() if len(models) == 1 and not cpu_only else None  # CPU ranks use no GPU
    return Where(scheduling_fragment(clusters, placement.gpus), clusters, placement.gpus, model, offloading)


# --- the plan ---------------------------------------------------------------------------------------------


def refuse(order: PodOrder, avoid: frozenset[str], settings: KubeSettings, seen: Situation) -> None:
    """The refusals that need neither the inventory nor the queue's state, in the order a user meets them
    (``plan_launch`` makes them first; the launcher makes them before it reads either)."""
    placement = order.placement
    if placement.ranks is None:
        refuse_no_gpus(placement)
    runner_image(placement, settings, seen)
    refuse_move(placement, seen.queue, avoid)
    if not avoid:  # a first launch; a pod moved elsewhere belongs to a cell already running
        refused = budget_refusal(settings.budget, seen.spend)
        if refused:
            raise OffloadUsageError(refused)
    if placement.ranks is not None:
        refuse_ranks(placement, placement.ranks, seen.queue)


def plan_launch(order: PodOrder, avoid: frozenset[str], settings: KubeSettings, trust: TrustPolicy,
                seen: Situation) -> LaunchPlan:
    """Plan launching ``order`` (a pod, or with ``placement.ranks`` an Indexed Job) on none of the ``avoid``
    clusters (a retry elsewhere); raises the launch's refusal, the first that applies."""
    placement = order.placement
    refuse(order, avoid, settings, seen)
    image = runner_image(placement, settings, seen)
    ranks, queue = placement.ranks, seen.queue
    # the hub's inventory says which clusters its chart trusts; this kernel's own policy (which the spawner
    # wrote from the same chart) decides, so placement and the intake of outputs never disagree
    inventory = apply_policy(seen.inventory, trust) if seen.inventory is not None else None
    if queue:
        where = queued_where(placement, queue, seen, trust, inventory)
    else:
        assert inventory is not None, "inventory_need() said the inventory is read to place"
        where = placed_where(placement, avoid, seen, settings, trust, inventory)
    # the out rank (or a queued pod) may land on any of the clusters: its outputs are trusted only when every one is
    judged = where.may_run_on or where.clusters
    outputs_from = next((c for c in judged if not is_trusted(c, trust)), judged[0])
    trusted = is_trusted(outputs_from, trust)
    stored = stores_bundle(order, seen.runner_size, settings)
    priority_class, protection = session_priority(placement, order.session, queue, settings)
    timeout = placement.timeout
    pod = RunnerPodSpec(
        run_id=order.run_id, namespace=settings.namespace, image=image, user=settings.user, kernel=settings.kernel,
        scheduling=where.scheduling,
        timeout=None if timeout is None or order.session else math.ceil(timeout) + DEADLINE_MARGIN,
        python=settings.python, session=order.session,
        # a runner on an untrusted cluster sends its outputs in the safe format (the bundle was made before
        # placement); the kernel refuses a pickle from there whatever the runner sends
        # part of a GPU: the runner is told its isolation and caps itself where the donor's mode allows
        env={**placement.env, **order.env, **(where.ask.runner_env() if where.ask else {}),
             **({} if trusted else {E.OUTPUT_FORMAT.name: "safe"})},
        server=settings.server, kernel_pid=seen.kernel_pid, metered=settings.metered, memory=seen.memory,
        cli=settings.cli, queue=queue,
        # a --priority without a queue is refused by runner_pod, naming the fix
        priority_class=priority_class, node_lost_seconds=settings.node_lost_seconds,
        session_notice=settings.session_notice, preimport=order.preimport,
    )
    what = f"{where.gpus} x {where.model}" if where.model else f"{where.gpus} GPU" + "s" * (where.gpus > 1)
    if ranks is None:
        ctx = PodContext(where.clusters[0], where.gpus, image, seen.memory, where.model,
                         where.ask.describe() if where.ask else "", shares=where.shares,
                         words=front_words(settings.cli)).on_cluster()
        return LaunchPlan(order.run_id, "Pod", queue, where.clusters, ctx, outputs_from, trusted, where.offloading,
                          stored, pod, waits_for=what if queue else "", protection=protection)
    ctx = PodContext(EITHER.join(where.clusters), placement.gpus, image, seen.memory, where.model,
                     words=front_words(settings.cli))
    job = RankJobSpec(pod, nodes=ranks.nodes, procs_per_node=ranks.procs_per_node,
                      master_port=master_port(order.run_id))
    # Kueue admits the Job's pods together, as one Workload: its place in line is the run's
    return LaunchPlan(order.run_id, "Job", queue, where.clusters, ctx, outputs_from, trusted, where.offloading,
                      stored, pod, job=job, waits_for=f"{ranks.nodes} pods of {what}" if queue else "")
