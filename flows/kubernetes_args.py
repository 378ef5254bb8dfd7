"""Pure builders: the ``@kubernetes`` and ``@environment`` arguments of an offloaded step.

They merge what the user wrote on ``@kubernetes`` (kept as is) with what offloading needs: the GPU count,
the Liqo toleration, a node selector for the chosen cluster or GPU model, and labels naming the flow, run
and step. A user value that contradicts ``@gpu_offload`` is an error naming both decorators; nothing here
touches the network.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_offload.liqo_peering import labels as L

from .decision import StepPlacement
from .errors import GpuOffloadFlowError
from .settings import RECORDED_ENV

LIQO_TOLERATION = {"key": L.VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": L.VIRTUAL_NODE_TAINT_EFFECT}
FLOW_LABEL = L.PREFIX + "flow"
STEP_LABEL = L.PREFIX + "step"
RUN_LABEL = L.RUN_ID
_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class StepIdentity:
    """Names the step's pods carry as labels."""

    flow: str
    step: str
    run_id: str | None = None
    """Unknown when the mutator runs; ``run_label`` adds it for ``run``, Argo labels its pods itself."""
    user: str | None = None
    """Who runs the flow (the hub user in a hub deployment): the hub's meter charges the step's GPU time to them."""


def label_value(text: str) -> str:
    """``text`` made a valid label value: allowed characters only, at most 63, alphanumeric at both ends."""
    value = _LABEL_BAD.sub("-", text)[:63]
    return value.strip("-_.")


def parse_node_selector(step: str, value: Any) -> dict[str, str]:
    """``@kubernetes``' node_selector as a dict; it also accepts ``"k=v,k2=v2"`` like Metaflow does."""
    if not value:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
        if all(len(p) == 2 for p in pairs):
            return {k.strip(): v.strip() for k, v in pairs}
    raise GpuOffloadFlowError(
        f"step '{step}': @kubernetes(node_selector={value!r}) is neither a dict nor 'key=value,...'; "
        "write node_selector={'key': 'value'}"
    )


def _merge_map(step: str, field: str, user: Mapping[str, str], ours: Mapping[str, str], offload: str) -> dict:
    merged = dict(user)
    for key, value in ours.items():
        if key in merged and merged[key] != value:
            raise GpuOffloadFlowError(
                f"step '{step}': @kubernetes({field}={{{key!r}: {merged[key]!r}}}) conflicts with {offload}, "
                f"which needs {key}={value}; remove {key!r} from @kubernetes({field}=...) or change {offload}"
            )
        merged[key] = value
    return merged


def _check_count(step: str, decorator: str, gpu: Any, placement: StepPlacement, offload: str) -> None:
    if gpu is not None and placement.resources:
        raise GpuOffloadFlowError(
            f"step '{step}': @{decorator}(gpu={gpu!r}) conflicts with {offload}, which asks its donor for "
            f"{extended_resources(placement)} in its units, not nvidia.com/gpu; drop gpu from @{decorator}"
        )
    if gpu is not None and str(gpu) != str(placement.gpus):
        raise GpuOffloadFlowError(
            f"step '{step}': @{decorator}(gpu={gpu!r}) conflicts with {offload}; give the GPU count once: "
            f"drop gpu from @{decorator} or write @gpu_offload(gpus={gpu})"
        )


def _check_gpu(step: str, user: Mapping[str, Any], placement: StepPlacement, offload: str) -> None:
    _check_count(step, "kubernetes", user.get("gpu"), placement, offload)
    vendor = user.get("gpu_vendor")
    if vendor and str(vendor).lower() != "nvidia":
        raise GpuOffloadFlowError(
            f"step '{step}': @kubernetes(gpu_vendor={vendor!r}) conflicts with {offload}, which requests "
            f"{L.GPU_RESOURCE} from Liqo donors; drop gpu_vendor from @kubernetes"
        )


def check_resources(step: str, resources: Mapping[str, Any], placement: StepPlacement, offload: str) -> None:
    """``@resources(gpu=N)`` must agree: Metaflow would give the pod the larger of it and ``@kubernetes``'s."""
    _check_count(step, "resources", resources.get("gpu"), placement, offload)


def node_selector(placement: StepPlacement) -> dict[str, str]:
    """Virtual nodes only; of the chosen cluster and/or with the GPU model when those are known."""
    selector = {L.TYPE_LABEL: L.TYPE_VIRTUAL_NODE}
    if placement.cluster_id:
        selector[L.REMOTE_CLUSTER_ID_LABEL] = placement.cluster_id
    if placement.gpu_model:
        selector[L.GPU_MODEL] = placement.gpu_model
    return selector


def pod_labels(identity: StepIdentity) -> dict[str, str]:
    """Labels that let admins and the hub find the pods of one flow, run and step.

    ``managed-by`` puts the pods under the hub's usage meter; they get no ``user`` label, so a kernel's
    cleanup, which selects on it, never takes a flow's pods for its own (the meter reads the annotation).
    """
    found = {L.MANAGED_BY: L.MANAGED_BY_VALUE, FLOW_LABEL: label_value(identity.flow),
             STEP_LABEL: label_value(identity.step)}
    if identity.run_id:
        found[RUN_LABEL] = label_value(identity.run_id)
    return {k: v for k, v in found.items() if v}


def queue_labels(placement: StepPlacement) -> dict[str, str]:
    """Kueue's labels: on the Job, Kueue's Job integration creates it suspended and admits it from the queue;
    on its pods (the template's labels), they are left to their Job."""
    if placement.queue is None:
        return {}
    found = {L.QUEUE_NAME_LABEL: placement.queue}
    if placement.priority:
        found[L.PRIORITY_CLASS_LABEL] = placement.priority
    return found


def extended_resources(placement: StepPlacement) -> dict[str, str]:
    """What a step holding part of a GPU asks its donor for, as ``@kubernetes(extended_resources=...)``: Metaflow
    puts them in the container's requests and limits, which is what Kueue counts against its flavors."""
    return {resource: str(count) for resource, count in placement.resources}


def kubernetes_kwargs(
    user: Mapping[str, Any], placement: StepPlacement, identity: StepIdentity, offload: str
) -> dict[str, Any]:
    """Every argument the user gave ``@kubernetes``, plus what offloading needs; raises on a conflict.

    ``offload`` is the ``@gpu_offload(...)`` text used in error messages.
    """
    step = placement.step
    _check_gpu(step, user, placement, offload)
    merged = dict(user)
    if placement.resources:  # part of a GPU: in the donor's units, which Metaflow's gpu= cannot name
        merged["extended_resources"] = _merge_map(step, "extended_resources", {
            str(k): str(v) for k, v in (user.get("extended_resources") or {}).items()},
            extended_resources(placement), offload)
    else:
        merged["gpu"] = placement.gpus
    merged["node_selector"] = _merge_map(
        step, "node_selector", parse_node_selector(step, user.get("node_selector")), node_selector(placement), offload
    )
    tolerations = [dict(t) for t in user.get("tolerations") or []]
    if not any(_tolerates_liqo(t) for t in tolerations):
        tolerations.append(dict(LIQO_TOLERATION))
    merged["tolerations"] = tolerations
    merged["labels"] = _merge_map(step, "labels", dict(user.get("labels") or {}),
                                  {**pod_labels(identity), **queue_labels(placement)}, offload)
    if identity.user:
        merged["annotations"] = _merge_map(step, "annotations", dict(user.get("annotations") or {}),
                                           {L.USER: identity.user}, offload)
    if placement.namespace and not user.get("namespace"):
        merged["namespace"] = placement.namespace
    return merged


def _tolerates_liqo(toleration: Mapping[str, Any]) -> bool:
    if toleration.get("key") != L.VIRTUAL_NODE_TAINT_KEY:
        return False
    effect = toleration.get("effect")
    return toleration.get("operator") == "Exists" and effect in (None, "", L.VIRTUAL_NODE_TAINT_EFFECT)


def environment_vars(user_vars: Mapping[str, Any], placement: StepPlacement, offload: str) -> dict[str, str]:
    """The user's ``@environment`` variables, what the step is told of the part of a GPU it holds (as a runner
    is: ``GPU_OFFLOAD_GPU_*``, docs/runner-protocol.md) and the recorded placement the step's pod reads back."""
    recorded = placement.to_json()
    theirs = user_vars.get(RECORDED_ENV)
    if theirs is not None and theirs != recorded:
        raise GpuOffloadFlowError(
            f"step '{placement.step}': @environment sets {RECORDED_ENV}, which {offload} writes itself; "
            f"remove it from @environment(vars=...)"
        )
    for name, value in placement.part:
        if name in user_vars and str(user_vars[name]) != value:
            raise GpuOffloadFlowError(
                f"step '{placement.step}': @environment sets {name}, which {offload} writes itself (the part of "
                f"a GPU the step holds); remove it from @environment(vars=...)"
            )
    return {**{k: str(v) for k, v in user_vars.items()}, **dict(placement.part), RECORDED_ENV: recorded}
