"""What ``@gpu_offload`` does to a step, on Metaflow's public ``MutableStep`` API.

Metaflow may run a step mutator more than once in one process (``argo-workflows create`` re-runs it after
attaching ``@kubernetes`` late) and does not restore the ``@kubernetes`` a previous run replaced. So the
first run records the user's own ``@kubernetes`` and ``@environment`` arguments in ``OriginalDecorators``
and every run rebuilds from those: running twice gives the same step as running once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .decision import StepPlacement, check_trusted_offline, decide, decide_queued, queued, recorded_placement
from .errors import GpuOffloadFlowError
from .kubernetes_args import StepIdentity, check_resources, environment_vars, kubernetes_kwargs
from .options import OffloadOptions, parse_options
from .run_label import INTERNAL_DECORATOR
from .settings import OffloadSettings, metaflow_settings, recorded_decision

OVERRIDE = 3
"""``MutableStep.OVERRIDE``: the decorator we add replaces the user's, which we merged into ours."""


@dataclass
class OriginalDecorators:
    """The user's own arguments, captured before the first mutation (mutable: filled once, then read)."""

    kubernetes: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None
    captured: bool = False


@dataclass
class MutatorState:
    """Per-decorator state kept across repeated ``mutate`` calls."""

    originals: OriginalDecorators = field(default_factory=OriginalDecorators)


def _user_arguments(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    # decorator_specs reports every attribute, defaults included; keep only what differs from the default,
    # which is what the user (or a config) actually set.
    from metaflow.plugins import STEP_DECORATORS

    defaults: dict[str, Any] = next((d.defaults for d in STEP_DECORATORS if d.name == name), {})
    return {k: v for k, v in kwargs.items() if k not in defaults or v != defaults[k]}


def with_config_defaults(user: Mapping[str, Any]) -> dict[str, Any]:
    """``@kubernetes`` arguments with Metaflow's configured node selector and tolerations where unset.

    Metaflow applies METAFLOW_KUBERNETES_NODE_SELECTOR / _TOLERATIONS only to a decorator that has none;
    the one we build always has some, so the configured ones are folded in here, as Metaflow would.
    """
    import json

    from metaflow.metaflow_config import KUBERNETES_NODE_SELECTOR, KUBERNETES_TOLERATIONS

    merged = dict(user)
    if not merged.get("node_selector") and KUBERNETES_NODE_SELECTOR:
        merged["node_selector"] = KUBERNETES_NODE_SELECTOR
    if not merged.get("tolerations") and KUBERNETES_TOLERATIONS:
        merged["tolerations"] = json.loads(KUBERNETES_TOLERATIONS)
    return merged


def capture(mutable_step: Any) -> OriginalDecorators:
    """The user's ``@kubernetes`` and ``@environment`` arguments as the step has them now."""
    found = OriginalDecorators(captured=True)
    for name, _fq, _args, kwargs in mutable_step.decorator_specs:
        if name == "kubernetes":
            found.kubernetes = _user_arguments(name, kwargs)
        elif name == "environment":
            found.environment = dict(kwargs.get("vars") or {})
        elif name == "resources":
            found.resources = _user_arguments(name, kwargs)
    return found


def step_requests(originals: OriginalDecorators) -> tuple[int, int]:
    """CPU millicores and memory bytes the step's pod will request, computed as Metaflow does: the larger of
    ``@kubernetes`` (its defaults included) and ``@resources``; memory is in MB (``4096`` -> ``4096M``)."""
    from metaflow.plugins import STEP_DECORATORS

    defaults: dict[str, Any] = next((d.defaults for d in STEP_DECORATORS if d.name == "kubernetes"), {})
    k8s = {**defaults, **(originals.kubernetes or {})}
    resources = originals.resources or {}
    try:
        cpu, memory = (max(float(k8s.get(key) or 0), float(resources.get(key) or 0)) for key in ("cpu", "memory"))
    except (TypeError, ValueError):
        return 0, 0  # not numbers: Metaflow rejects them itself, naming the attribute
    return int(cpu * 1000), int(memory * 10**6)


def place_step(
    step: str, options: OffloadOptions, settings: OffloadSettings, environ: Mapping[str, str],
    needs: tuple[int, int] = (0, 0),
) -> StepPlacement:
    """The recorded decision when there is one (inside the step's pod: offline), else a fresh one placed
    with ``needs`` (CPU millicores, memory bytes) as well as the GPUs, with its Kueue queue when there is one."""
    recorded = recorded_placement(step, recorded_decision(environ))
    if recorded is not None:
        # a part of a GPU is recorded as the shares it became on its donor, so only its being a part is compared
        if (recorded.share is not None) != options.part or (not options.part and recorded.gpus != options.gpus):
            raise GpuOffloadFlowError(
                f"step '{step}': {options.describe()} differs from the placement recorded at deploy time "
                f"({recorded.gpus} GPUs); deploy the flow again"
            )
        return recorded
    if downstream(environ):
        # This process runs (or launches) another step; Metaflow still mutates every step of the flow.
        # Their placement is not used here, so it must not ask a cluster (a pod's in-cluster account) or
        # read an inventory file the pod does not have.
        offline = OffloadSettings(cluster=settings.cluster, gpu_model=settings.gpu_model, source="config")
        unused = dataclasses.replace(options, fraction=None, gpu_memory=None)  # a part needs an inventory
        return decide(step, unused, offline, None, "config")
    settings = with_found_queue(settings)
    if settings.queue is not None:
        # Kueue decides which donor takes the step: no placement here, only what the step narrows
        inventory = None
        if settings.source != "config":
            from .live import live_inventory

            inventory = live_inventory(settings)  # also refuses a namespace Liqo does not offload
        if inventory is None and options.part and settings.inventory:  # a part is asked in its donors' units
            from .inventory_file import load_inventory

            inventory = load_inventory(settings.inventory)
        return queued(decide_queued(step, options, settings, trusted_ids(environ), inventory), options, settings)
    return queued(_placed(step, options, settings, environ, needs), options, settings)


def with_found_queue(settings: OffloadSettings) -> OffloadSettings:
    """``settings`` with the namespace's one LocalQueue when no setting names a queue (as a kernel finds its
    own), looked up where placement asks the cluster."""
    if settings.queue is not None:
        return settings
    from .live import live_queue

    found = live_queue(settings)
    return dataclasses.replace(settings, queue=found) if found else settings


def _placed(step: str, options: OffloadOptions, settings: OffloadSettings, environ: Mapping[str, str],
            needs: tuple[int, int]) -> StepPlacement:
    if settings.source != "config":
        from .live import live_inventory

        inventory = live_inventory(settings)
        if inventory is not None:
            return decide(step, options, settings, inventory, "live", needs)
    if settings.inventory:
        from .inventory_file import load_inventory

        return decide(step, options, settings, load_inventory(settings.inventory), "inventory", needs)
    check_trusted_offline(step, options, settings, trusted_ids(environ))
    return decide(step, options, settings, None, "config")


def check_extended_resources(step: str, offload: str) -> None:
    """Part of a GPU is asked through ``@kubernetes(extended_resources=...)``, which Metaflow has since 2.19.34."""
    from metaflow.plugins import STEP_DECORATORS

    defaults: dict[str, Any] = next((d.defaults for d in STEP_DECORATORS if d.name == "kubernetes"), {})
    if "extended_resources" not in defaults:
        import metaflow

        raise GpuOffloadFlowError(
            f"step '{step}': {offload} asks for part of a GPU in its donor's units through "
            f"@kubernetes(extended_resources=...), which Metaflow {getattr(metaflow, '__version__', '?')} lacks; "
            "install Metaflow 2.19.34 or later (pip install 'metaflow>=2.19.34,<2.20'), or ask for whole GPUs")


def trusted_ids(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The clusters the deploying process's origin trusts (``GPU_OFFLOAD_TRUSTED_CLUSTERS``, as for cells)."""
    from gpu_offload.liqo_peering.trust import policy_from_env

    return policy_from_env(environ).trusted_ids


def downstream(environ: Mapping[str, str]) -> bool:
    """True in a step's pod or trampoline: a decision was recorded for some step, or Kubernetes runs us."""
    return bool(recorded_decision(environ) or environ.get("METAFLOW_KUBERNETES_WORKLOAD"))


def flow_user(environ: Mapping[str, str]) -> str | None:
    """Who the step's GPU time is charged to: the hub user in a hub deployment, else Metaflow's user."""
    if environ.get("JUPYTERHUB_USER"):
        return environ["JUPYTERHUB_USER"]
    from metaflow.util import get_username

    return get_username() or None


def flow_name(step_function: Any) -> str:
    """The flow class's name, which is Metaflow's flow name, from the step function's qualified name."""
    parts = str(getattr(step_function, "__qualname__", "")).split(".")
    return parts[-2] if len(parts) >= 2 else "flow"


def mutate_step(
    mutable_step: Any, step_function: Any, args: Sequence[Any], kwargs: Mapping[str, Any], state: MutatorState
) -> StepPlacement | None:
    """Add (or merge into) the step's ``@kubernetes`` and ``@environment``; returns the placement used.

    With the local backend the arguments are still checked, and nothing is added (returns None).
    """
    step = str(getattr(step_function, "name", getattr(step_function, "__name__", "step")))
    options = parse_options(step, list(args), kwargs)
    settings = metaflow_settings()
    if settings.backend == "local":
        return None  # the step stays as written and runs where the flow runs
    if not state.originals.captured:
        state.originals = capture(mutable_step)
    placement = place_step(step, options, settings, os.environ, step_requests(state.originals))
    identity = StepIdentity(flow_name(step_function), step, user=flow_user(os.environ))
    offload = options.describe()
    check_resources(step, state.originals.resources or {}, placement, offload)
    if placement.resources:
        check_extended_resources(step, offload)
    k8s = kubernetes_kwargs(with_config_defaults(state.originals.kubernetes or {}), placement, identity, offload)
    env = environment_vars(state.originals.environment or {}, placement, offload)
    mutable_step.add_decorator("kubernetes", deco_kwargs=k8s, duplicates=OVERRIDE)
    mutable_step.add_decorator("environment", deco_kwargs={"vars": env}, duplicates=OVERRIDE)
    # After @kubernetes, so that its runtime hook sees the command @kubernetes built.
    mutable_step.add_decorator(INTERNAL_DECORATOR, duplicates=OVERRIDE)
    return placement
