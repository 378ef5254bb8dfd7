"""Kubernetes matching rules shared by the scheduler and Liqo's webhook: node selectors, taints, quantities."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity


def quantity(value: object) -> Decimal:
    """The numeric value of a Kubernetes quantity (``"500m"`` -> 0.5, ``"1Gi"`` -> 1073741824)."""
    try:
        return parse_quantity(str(value).strip())
    except (ValueError, ArithmeticError) as exc:
        raise ValueError(f"{value!r} is not a Kubernetes quantity: write e.g. 500m, 2, 1Gi") from exc


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = list(req.get("values") or [])
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions, all ANDed; empty matches everything."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_requirement_matches(r, labels.get(r["key"])) for r in selector.get("matchExpressions") or [])


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """One NodeSelectorTerm: its requirements are ANDed; an empty term matches nothing."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    return all(_requirement_matches(r, labels.get(r["key"])) for r in exprs) and all(
        _requirement_matches(r, name if r["key"] == "metadata.name" else None) for r in fields)


def node_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """A NodeSelector: its terms are ORed."""
    return any(term_matches(t, labels, name) for t in selector.get("nodeSelectorTerms") or [])


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether some toleration tolerates ``taint`` (empty key with Exists tolerates everything)."""
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def and_node_selectors(first: Sequence[Mapping[str, Any]],
                       second: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Terms matching what both term lists match (ORs of ANDs: the cross product of their terms)."""
    if not first:
        return [dict(t) for t in second]
    if not second:
        return [dict(t) for t in first]
    out = []
    for a in first:
        for b in second:
            merged: dict[str, Any] = {}
            for key in ("matchExpressions", "matchFields"):
                reqs = [*(a.get(key) or []), *(b.get(key) or [])]
                if reqs:
                    merged[key] = [dict(r) for r in reqs]
            out.append(merged)
    return out
