"""Tolerations as kube-apiserver and the node controller read them: matching a taint, and the
DefaultTolerationSeconds admission plugin (enabled by default), which gives every new pod that tolerates neither
node taint 300 s of each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
DEFAULT_TOLERATION_SECONDS = 300


def tolerates(toleration: Mapping[str, Any], key: str, effect: str = "NoExecute") -> bool:
    """Whether ``toleration`` matches a taint ``key`` with ``effect`` (any value), as Kubernetes matches them."""
    if toleration.get("effect") not in (None, "", effect):
        return False
    if toleration.get("key") in (None, ""):
        return toleration.get("operator") == "Exists"
    return toleration.get("key") == key


def default_tolerations(spec: dict[str, Any]) -> None:
    """DefaultTolerationSeconds admission on a pod being created: each node taint it does not tolerate is
    tolerated for 300 s (kube-apiserver writes these into the pod's spec)."""
    tolerations = list(spec.get("tolerations") or [])
    for key in (NOT_READY, UNREACHABLE):
        if not any(tolerates(t, key) for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})
    spec["tolerations"] = tolerations
