"""Evaluating a Kubernetes NodeSelector against a label set (pure), for reasoning about clusterSelectors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_matches(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One ``matchExpressions`` entry against node labels, with the API server's semantics."""
    key, op, values = req.get("key", ""), req.get("operator"), list(req.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        have, bound = _int(labels[key]), _int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: its requirements are ANDed; an empty term matches nothing.

    ``matchFields`` cannot be judged from labels, so a term using it counts as not matching: callers only
    use this to decide whether to add a term, and adding one is always safe.
    """
    exprs = list(term.get("matchExpressions") or [])
    if not exprs or term.get("matchFields"):
        return False
    return all(requirement_matches(r, labels) for r in exprs)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A NodeSelector: its terms are ORed."""
    return any(term_matches(t, labels) for t in selector.get("nodeSelectorTerms") or [])
