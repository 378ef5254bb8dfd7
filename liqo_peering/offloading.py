"""Reading a NamespaceOffloading's status (pure): is the namespace ready to send pods to these clusters?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import labels as L
from .untrusted_text import shown

# Phases after which waiting longer does not help: the selector or the donors must change first.
FAILED_PHASES = ("NoClusterSelected", "AllFailed", "Terminating")


@dataclass(frozen=True)
class OffloadingState:
    """What the NamespaceOffloading's status says about the clusters a pod needs."""

    phase: str
    """``offloadingPhase`` as Liqo reports it, or ``(not reconciled yet)``."""
    ready: bool
    """Every wanted cluster has its remote namespace: pods may go there now."""
    failed: bool
    """Waiting will not help (see ``FAILED_PHASES``)."""
    detail: str
    """The clusters that are not ready and why, for the error message."""


def _remote_ready(conditions: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    if not conditions:
        return False, "not selected"  # Liqo lists only the clusters the selector picked
    for cond in conditions:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True", shown(cond.get("message") or cond.get("reason") or "")
    return False, "no Ready condition"


def offloading_state(obj: Mapping[str, Any], cluster_ids: Sequence[str]) -> OffloadingState:
    """The state of ``obj`` (a NamespaceOffloading) for ``cluster_ids``.

    A status older than the spec (``observedGeneration`` behind ``generation``) is not trusted: right after
    a create or an update Liqo has not looked yet. ``SomeFailed`` is fine when the failures are elsewhere.
    """
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    generation = int(meta.get("generation") or 1)
    if not status or int(status.get("observedGeneration") or 0) < generation:
        return OffloadingState("(not reconciled yet)", False, False, "Liqo has not processed the latest spec")
    phase = str(status.get("offloadingPhase") or "(none)")
    per_cluster = status.get("remoteNamespacesConditions") or {}
    missing: list[str] = []
    for cid in cluster_ids:
        ok, why = _remote_ready(per_cluster.get(cid) or [])
        if not ok:
            missing.append(f"{cid} ({why})")
    ready = phase in ("Ready", "SomeFailed") and not missing
    detail = "; ".join(missing) if missing else ""
    return OffloadingState(phase, ready, phase in FAILED_PHASES, detail)


def describe_not_ready(namespace: str, state: OffloadingState, waited: float) -> str:
    """The sentence for a namespace that did not become ready, naming the phase and the next step."""
    what = f"NamespaceOffloading {namespace}/{L.NAMESPACE_OFFLOADING_NAME} is in phase {state.phase}"
    if state.detail:
        what += f", remote namespace missing on {state.detail}"
    if state.failed:
        step = "check the peering (gpu-offload clusters) and the clusterSelector (kubectl get namespaceoffloading -o yaml)"
        return f"{what}; pods cannot leave the cluster: {step}"
    return f"{what} after {waited:g}s; Liqo is still working on it: retry shortly, or check liqo-controller-manager"
