"""Where a pending pod goes: the filters of kube-scheduler's default profile that the project relies on.

Pure: ``decide(pod, nodes, pods)`` needs no API. The filters run in kube-scheduler's order and a node is
reported under the first one it fails, so the FailedScheduling message reads like the real one:
``0/3 nodes are available: 1 node(s) had untolerated taint {virtual-node.liqo.io/not-allowed: true},
2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for
scheduling, 2 No preemption victims found for incoming pod.`` (the sandbox has no priorities, so
preemption never finds a victim).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..apiserver.matching import node_selector_matches, quantity, tolerates

UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = "Too many pods"
_NOT_HELPFUL = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"
_TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Decision:
    """The scheduler's answer for one pod: a node, or why there is none."""

    node: str | None
    message: str = ""
    """Empty when bound; otherwise the FailedScheduling message."""


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the pod asks of a node: per resource, requests (limits where a request is missing), the sum
    over containers or the largest init container, whichever is more."""
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> dict[str, Decimal]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for key, value in of(container).items():
            total[key] = total.get(key, Decimal(0)) + value
    for init in spec.get("initContainers") or []:
        for key, value in of(init).items():
            total[key] = max(total.get(key, Decimal(0)), value)
    return total


def _untolerated_taint(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    tolerations = pod_spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    return None


def _affinity_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    return required is None or node_selector_matches(required, labels, meta.get("name", ""))


def _insufficient(requests: Mapping[str, Decimal], node: Mapping[str, Any],
                  used: Mapping[str, Decimal], pod_count: int) -> list[str]:
    allocatable = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    reasons = []
    if "pods" in allocatable and pod_count + 1 > allocatable["pods"]:
        reasons.append(TOO_MANY_PODS)
    for resource, amount in sorted(requests.items()):
        if amount <= 0:
            continue
        if used.get(resource, Decimal(0)) + amount > allocatable.get(resource, Decimal(0)):
            reasons.append(f"Insufficient {resource}")
    return reasons


def node_reasons(pod: Mapping[str, Any], node: Mapping[str, Any], used: Mapping[str, Decimal],
                 pod_count: int) -> list[str]:
    """Why ``pod`` cannot go to ``node`` (empty when it can), from the first filter that fails."""
    spec = pod.get("spec") or {}
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not tolerates(
            spec.get("tolerations") or [], {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return [UNSCHEDULABLE]
    taint = _untolerated_taint(spec, node)
    if taint:
        return [taint]
    if not _affinity_matches(spec, node):
        return [AFFINITY]
    return _insufficient(pod_requests(pod), node, used, pod_count)


def usage(pods: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[str, Decimal]], Counter[str]]:
    """Per node, the requests of the pods bound to it that still hold resources, and how many they are."""
    used: dict[str, dict[str, Decimal]] = {}
    counts: Counter[str] = Counter()
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or (pod.get("status") or {}).get("phase") in _TERMINAL:
            continue
        counts[node_name] += 1
        bucket = used.setdefault(node_name, {})
        for key, value in pod_requests(pod).items():
            bucket[key] = bucket.get(key, Decimal(0)) + value
    return used, counts


def failure_message(reasons_per_node: Mapping[str, list[str]]) -> str:
    """kube-scheduler's FailedScheduling message for nodes that all failed."""
    total = len(reasons_per_node)
    histogram: Counter[str] = Counter(r for reasons in reasons_per_node.values() for r in reasons)
    preemption: Counter[str] = Counter(
        _NOT_HELPFUL if any(r in (UNSCHEDULABLE, AFFINITY) or r.startswith("node(s) had untolerated")
                            for r in reasons) else _NO_VICTIMS
        for reasons in reasons_per_node.values())
    main = ", ".join(sorted(f"{n} {r}" for r, n in histogram.items()))
    tail = ", ".join(sorted(f"{n} {r}" for r, n in preemption.items()))
    if total == 0:
        return "no nodes available to schedule pods"
    return f"0/{total} nodes are available: {main}. preemption: 0/{total} nodes are available: {tail}."


def decide(pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]],
           pods: Iterable[Mapping[str, Any]]) -> Decision:
    """Pick a node for ``pod`` among ``nodes``, given every pod already in the cluster (``pods``).

    Among the nodes that fit, the one with the smallest share of its GPUs, then cpu, already requested
    wins (ties by name), which spreads pods the way kube-scheduler's least-allocated score does.
    """
    used, counts = usage(pods)
    reasons: dict[str, list[str]] = {}
    fitting: list[tuple[Decimal, Decimal, str]] = []
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        node_used = used.get(name, {})
        why = node_reasons(pod, node, node_used, counts[name])
        if why:
            reasons[name] = why
            continue
        alloc = (node.get("status") or {}).get("allocatable") or {}
        fitting.append((_share(node_used, alloc, "nvidia.com/gpu"), _share(node_used, alloc, "cpu"), name))
    if fitting:
        return Decision(min(fitting)[2])
    return Decision(None, failure_message(reasons))


def _share(used: Mapping[str, Decimal], allocatable: Mapping[str, Any], resource: str) -> Decimal:
    total = quantity(allocatable.get(resource, 0))
    return used.get(resource, Decimal(0)) / total if total else Decimal(0)
