"""Where an ``@gpu_offload`` step goes, decided once and recorded so every later process reuses it.

The decision is made where the flow is validated (``run``, ``argo-workflows create``): from the live
cluster through ``gpu_offload.liqo_peering`` when it is reachable, else from an offline inventory file,
else from configuration alone. It is then written into the step's environment, so the mutator that
Metaflow runs again inside the step's pod (or the local ``kubernetes step`` trampoline) reads it back
instead of asking a cluster it may not reach: the same answer, with no network.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from .errors import GpuOffloadFlowError
from .options import AUTO, OffloadOptions
from .settings import OffloadSettings

if TYPE_CHECKING:
    from gpu_offload.liqo_peering.inventory import Inventory

Origin = Literal["recorded", "live", "inventory", "config", "kueue"]
WHY_TRUSTED = (
    "@gpu_offload steps go to trusted clusters only, since Metaflow's artifacts are pickles that the step's pod "
    "writes and later steps and notebooks load (a donor's admins could run code there); write "
    "@gpu_offload(untrusted_ok=True) to allow untrusted clusters for this step"
)
# liqo_peering words its hints for the cell magic (`--gpus 4`); a flow author writes decorator arguments.
_MAGIC_OPTION = re.compile(r"--(gpus|gpu-model|cluster) (\S+?)(?=[ )]|$)")


@dataclass(frozen=True)
class StepPlacement:
    """The placement of one step: what the ``@kubernetes`` decorator is built from."""

    step: str
    gpus: int
    cluster_id: str | None
    """Cluster the pod is pinned to (``liqo.io/remote-cluster-id``), or None for any virtual node."""
    gpu_model: str | None
    namespace: str | None
    origin: Origin
    """Where the decision came from; ``recorded`` inside the step's own pod; ``kueue``: left to Kueue."""
    queue: str | None = None
    """The Kueue LocalQueue the step's Job waits in (``kueue.x-k8s.io/queue-name``); None: not queued."""
    priority: str | None = None
    """Its Kueue priority class (``kueue.x-k8s.io/priority-class``); None: Kueue's default."""
    share: float | None = None
    """Part of one GPU the step holds; None: whole GPUs."""
    resources: tuple[tuple[str, int], ...] = ()
    """Part of a GPU: the donor's units it is asked in (``@kubernetes(extended_resources=...)``: shares, a MIG
    profile, an isolator's slot and MiB); empty: ``gpus`` whole GPUs (``@kubernetes(gpu=...)``)."""
    part: tuple[tuple[str, str], ...] = ()
    """Part of a GPU: what the step's process is told of it, as a runner is (``ResourceAsk.runner_env``: the
    donor's sharing mode, the isolation, the bytes or the share of the GPU it may use)."""

    def to_json(self) -> str:
        """The compact form recorded in the step's environment."""
        data = asdict(self)
        data.pop("origin")
        for key in ("queue", "priority", "share"):  # a step that does not queue keeps the record it always had
            if data[key] is None:
                data.pop(key)
        for key in ("resources", "part"):
            if not data[key]:
                data.pop(key)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def recorded_placement(step: str, text: str | None) -> StepPlacement | None:
    """The decision recorded for ``step``, or None when there is none (or it was made for another step)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        if data.get("step") != step:
            return None
        return StepPlacement(
            step=step,
            gpus=int(data["gpus"]),
            cluster_id=data.get("cluster_id"),
            gpu_model=data.get("gpu_model"),
            namespace=data.get("namespace"),
            origin="recorded",
            queue=data.get("queue"),
            priority=data.get("priority"),
            share=float(data["share"]) if data.get("share") is not None else None,
            resources=tuple((str(r), int(n)) for r, n in data.get("resources") or ()),
            part=tuple((str(k), str(v)) for k, v in data.get("part") or ()),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise GpuOffloadFlowError(
            f"step '{step}': the recorded placement {text!r} cannot be read ({exc}); it is written by "
            "@gpu_offload itself: unset METAFLOW_GPU_OFFLOAD_PLACEMENT and deploy again"
        ) from exc


def check_trusted_offline(step: str, options: OffloadOptions, settings: OffloadSettings,
                          trusted_ids: tuple[str, ...]) -> None:
    """Without an inventory, a step may go only where it is pinned to a trusted cluster (unless
    ``untrusted_ok``): nothing else tells trusted virtual nodes from untrusted ones."""
    if options.untrusted_ok:
        return
    cluster = options.cluster if options.cluster != AUTO else (settings.cluster or AUTO)
    if cluster in trusted_ids:
        return
    where = ("no cluster is named, so the step could land on any donor" if cluster == AUTO
             else f"cluster {cluster} is not trusted")
    raise GpuOffloadFlowError(
        f"step '{step}' {options.describe()}: placed without an inventory, and {where} (trusted: "
        f"{', '.join(trusted_ids) or 'none'}; the origin's GPU_OFFLOAD_TRUSTED_CLUSTERS). {WHY_TRUSTED}; or name a "
        "trusted cluster (cluster=...), or let placement read the cluster or an inventory [placement from config]"
    )


def queued(placement: StepPlacement, options: OffloadOptions, settings: OffloadSettings) -> StepPlacement:
    """``placement`` with the step's Kueue queue and priority class: the step's own ``priority=``, else the
    deployment's; a priority without a queue is refused, as for cells."""
    if settings.queue is None:
        if options.priority:
            raise GpuOffloadFlowError(
                f"step '{placement.step}' {options.describe()}: queueing through Kueue is off here (neither "
                "METAFLOW_GPU_OFFLOAD_QUEUE nor the hub's GPU_OFFLOAD_QUEUE is set, and no LocalQueue was found in "
                "the step pods' namespace), so a priority means nothing; leave priority out, or set the LocalQueue "
                "of your namespace in METAFLOW_GPU_OFFLOAD_QUEUE")
        return placement
    return dataclasses.replace(placement, queue=settings.queue, priority=options.priority or settings.priority)


def decide_queued(step: str, options: OffloadOptions, settings: OffloadSettings, trusted_ids: tuple[str, ...],
                  inventory: Inventory | None = None) -> StepPlacement:
    """Under Kueue, Kueue picks the donor (a flavor) when it admits the step's Job: nothing is chosen here. Only
    what the step narrows becomes its node selector, which Kueue honours when it picks a flavor: a ``cluster``
    pin, the one trusted cluster of a step that may use only trusted ones, a GPU model. ``inventory``, when
    known, resolves a pinned cluster's name and the model's spelling."""
    cluster = options.cluster if options.cluster != AUTO else (settings.cluster or AUTO)
    where = f"step '{step}' {options.describe()}: queueing through Kueue is on (LocalQueue {settings.queue})"
    if options.fallback_models:
        raise GpuOffloadFlowError(
            f"{where}, so Kueue picks the donor, and Metaflow's @kubernetes can tell it only one GPU model (a node "
            f"selector, not an affinity); name one: @gpu_offload(gpu_model={options.gpu_model!r}), or none")
    if cluster == AUTO and not options.untrusted_ok:
        if len(trusted_ids) != 1:
            raise GpuOffloadFlowError(
                f"{where}, so Kueue picks the donor, and Metaflow's @kubernetes can name it only one cluster (a "
                f"node selector), not the trusted ones ({', '.join(trusted_ids) or 'none'}; the origin's "
                f"GPU_OFFLOAD_TRUSTED_CLUSTERS). {WHY_TRUSTED}; or pin the step to a trusted cluster (cluster=...)")
        cluster = trusted_ids[0]  # the only place the step may go: Kueue still admits it and picks the flavor
    model = options.gpu_model or settings.gpu_model
    if inventory is not None:
        if cluster != AUTO:
            found = inventory.cluster(cluster)
            if found is None:
                raise GpuOffloadFlowError(
                    f"{where} and the step is pinned to cluster {cluster}, which is not peered (peered: "
                    f"{', '.join(c.cluster_id for c in inventory.clusters) or 'none'}); name one of those")
            cluster = found.cluster_id
        # the node selector must carry the label value exactly as the nodes have it
        model = next((vn.model for vn in inventory.virtual_nodes
                      if model and vn.model and vn.model.lower() == model.lower()), model)
    if cluster != AUTO and not options.untrusted_ok and cluster not in trusted_ids:
        raise GpuOffloadFlowError(
            f"{where} and cluster {cluster} is not trusted (trusted: {', '.join(trusted_ids) or 'none'}; the "
            f"origin's GPU_OFFLOAD_TRUSTED_CLUSTERS). {WHY_TRUSTED}")
    if options.part:
        return _queued_part(step, options, settings, cluster, model, inventory, where)
    if inventory is not None:
        return _queued_whole(step, options, settings, cluster, model, inventory, where)
    return StepPlacement(step, options.gpus, None if cluster == AUTO else cluster, model, settings.namespace, "kueue")


def _queued_whole(step: str, options: OffloadOptions, settings: OffloadSettings, cluster: str, model: str | None,
                  inventory: Inventory, where: str) -> StepPlacement:
    """Queued whole GPUs, as a cell's (``shares.queued_whole``): a flavor counts ``nvidia.com/gpu`` as its nodes
    offer it, so where some donors' count shares or an isolator's slots the step is held to the donors lending
    whole GPUs (pinned, or refused when a node selector cannot say which), or asks an isolator for one slot and
    all of its GPU's memory when no donor lends whole GPUs."""
    from gpu_offload.liqo_peering.errors import NoFit
    from gpu_offload.liqo_peering.placement import price_key
    from gpu_offload.liqo_peering.shares import queued_whole
    from gpu_offload.liqo_peering.sharing import GPU

    try:
        whole = queued_whole(inventory.virtual_nodes, options.gpus, () if cluster == AUTO else (cluster,), [model],
                             price_key, single=True)
    except NoFit as exc:
        raise GpuOffloadFlowError(f"{where}: {as_decorator_hint(str(exc))}") from exc
    resources = whole.ask.resources if whole.ask is not None else ()
    if whole.clusters and cluster == AUTO:
        what = f"{options.gpus} whole GPU{'s' * (options.gpus != 1)}"
        cluster = _one_cluster(inventory, whole.clusters, [r for r, _ in resources] or [GPU], model,
                               f"{where}, so Kueue picks the donor for {what}", "whole GPUs")
    return StepPlacement(step, options.gpus, None if cluster == AUTO else cluster, model, settings.namespace, "kueue",
                         resources=resources,
                         part=tuple(sorted(whole.ask.runner_env().items())) if whole.ask is not None else ())


def _queued_part(step: str, options: OffloadOptions, settings: OffloadSettings, cluster: str, model: str | None,
                 inventory: Inventory | None, where: str) -> StepPlacement:
    """A queued part of a GPU, as a cell's (``shares.queued_ask``): asked in the units of the cheapest donor that
    can lend it, which Kueue's flavors count (``queues sync`` gives each flavor its nodes' shared resources), and
    held to the donors that lend it in the same units. A node selector names one cluster: the step is pinned to
    the one that lends it so, or left to Kueue when no other donor's flavor counts those resources; else it must
    name one."""
    if inventory is None:
        raise GpuOffloadFlowError(
            f"{where}, and part of a GPU is asked for in the units its donor lends GPUs in, which only the cluster "
            "or an inventory tells (METAFLOW_GPU_OFFLOAD_INVENTORY); placement here is from configuration alone "
            "[placement from config]")
    from gpu_offload.liqo_peering.errors import NoFit
    from gpu_offload.liqo_peering.placement import price_key
    from gpu_offload.liqo_peering.shares import describe, queued_ask
    from gpu_offload.liqo_peering.sharing import FractionRequest

    fraction = FractionRequest(options.fraction or 1.0, options.gpu_memory)
    try:
        ask, lending = queued_ask(inventory.virtual_nodes, fraction, () if cluster == AUTO else (cluster,), [model],
                                  price_key)
    except NoFit as exc:
        raise GpuOffloadFlowError(f"{where}: {as_decorator_hint(str(exc))}") from exc
    if cluster == AUTO:
        cluster = _one_cluster(inventory, lending, [r for r, _ in ask.resources], model,
                               f"{where}, so Kueue picks the donor for {describe(fraction)} "
                               f"({', '.join(f'{n} {r}' for r, n in ask.resources)})", "that part of a GPU")
    return StepPlacement(step, 1, None if cluster == AUTO else cluster, model, settings.namespace, "kueue",
                         share=ask.share, resources=ask.resources, part=tuple(sorted(ask.runner_env().items())))


def _one_cluster(inventory: Inventory, lending: tuple[str, ...], resources: list[str], model: str | None,
                 where: str, what: str) -> str:
    """The cluster a queued step is pinned to: the one of ``lending`` when it is alone, else AUTO when no other
    donor's nodes (of ``model``) offer any of ``resources``, so no other flavor counts them. Otherwise refused:
    Kueue could admit the step where those units are another part of a GPU, and ``@kubernetes`` can name Kueue
    one cluster only (a node selector, not an affinity)."""
    if len(lending) == 1:
        return lending[0]
    others = sorted({vn.cluster_id for vn in inventory.virtual_nodes
                     if vn.cluster_id not in lending and (model is None or vn.model == model)
                     and any(r == resource and allocatable > 0 for r, allocatable, _ in vn.devices
                             for resource in resources)})
    if not others:
        return AUTO
    raise GpuOffloadFlowError(
        f"{where}: those units are {what} on {', '.join(lending)}, while {', '.join(others)} "
        f"count{'s' * (len(others) == 1)} them too as another part of a GPU, and Metaflow's "
        "@kubernetes can name Kueue one cluster only (a node selector, not an affinity); pin the step to one of "
        f"those that lend it so: {' or '.join(f'@gpu_offload(cluster={c!r})' for c in lending)}")


def _as_argument(match: re.Match[str]) -> str:
    name, value = match.group(1).replace("-", "_"), match.group(2)
    return f"@gpu_offload({name}={value})" if name == "gpus" else f"@gpu_offload({name}={value!r})"


def as_decorator_hint(message: str) -> str:
    """``message`` with the magic's options (``--gpus 4``) written as ``@gpu_offload`` arguments."""
    return _MAGIC_OPTION.sub(_as_argument, message)


def decide(
    step: str, options: OffloadOptions, settings: OffloadSettings, inventory: Inventory | None, origin: Origin,
    needs: tuple[int, int] = (0, 0),
) -> StepPlacement:
    """Place ``step``: on ``inventory`` when one is known (checking names, GPUs and, from ``needs``, the CPU
    millicores and memory bytes the step's pod requests), else from settings."""
    cluster = options.cluster if options.cluster != AUTO else (settings.cluster or AUTO)
    model = options.gpu_model or settings.gpu_model
    if inventory is None:
        if options.part:
            raise GpuOffloadFlowError(
                f"step '{step}' {options.describe()}: part of a GPU is placed on a donor that lends shares, which "
                "only the cluster or an inventory tells (METAFLOW_GPU_OFFLOAD_INVENTORY); placement here is from "
                "configuration alone [placement from config]")
        return StepPlacement(
            step, options.gpus, None if cluster == AUTO else cluster, model, settings.namespace, "config"
        )
    from gpu_offload.liqo_peering.errors import GpuOffloadError
    from gpu_offload.liqo_peering.placement import POLICIES, PlacementRequest, place
    from gpu_offload.liqo_peering.sharing import FractionRequest

    # the decorator's fallback models follow its own model, never the configured default
    fallback = options.fallback_models if options.gpu_model else ()
    fraction = FractionRequest(options.fraction or 1.0, options.gpu_memory) if options.part else None
    request = PlacementRequest(gpus=options.gpus, gpu_model=model, cluster=cluster, fallback_models=fallback,
                               cpu=needs[0], memory=needs[1], trusted_only=not options.untrusted_ok,
                               fraction=fraction)
    try:
        chosen = place(inventory, request, POLICIES[settings.policy])
    except GpuOffloadError as exc:
        where = "the cluster" if origin == "live" else f"the inventory ({settings.inventory})"
        why = f"; {WHY_TRUSTED}" if "only trusted clusters" in str(exc) else ""
        raise GpuOffloadFlowError(
            f"step '{step}' {options.describe()}: {as_decorator_hint(str(exc))}{why} [placement from {where}]"
        ) from exc
    # The node selector must carry the label value exactly as the nodes have it; placement matched the
    # model case-insensitively, so take the model from the chosen node.
    label_model = chosen.model if model else None
    if chosen.ask is not None:  # part of a GPU: in its donor's units, told to the step as to a runner
        return StepPlacement(step, 1, chosen.cluster_id, label_model, settings.namespace, origin,
                             share=chosen.ask.share, resources=chosen.ask.resources,
                             part=tuple(sorted(chosen.ask.runner_env().items())))
    return StepPlacement(step, options.gpus, chosen.cluster_id, label_model, settings.namespace, origin)
