"""Label and field selectors, parsed once per request and matched against stored objects.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a`` (exists) and
``!a`` (does not exist), comma-separated, all required. Field selectors: ``=``, ``==`` and ``!=`` on the
fields the real server indexes for the kinds the project lists (see ``FIELDS``); any other field is the
400 a real server returns, so a client that relies on an unsupported field fails loudly here too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*({_NAME})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_CMP_RE = re.compile(rf"^\s*({_NAME})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_NAME})\s*$")


@dataclass(frozen=True)
class Requirement:
    """One term of a selector: ``key op values``."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, value: str | None) -> bool:
        """Whether an object whose key holds ``value`` (None: absent) satisfies this term."""
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        # "!=" and "notin" match objects that lack the key, as in Kubernetes
        return value is None or value not in self.values


def _split_terms(text: str) -> list[str]:
    # commas separate terms except inside the parentheses of a set-based term
    terms, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    """Parse a ``labelSelector`` query value; raises a 400 ApiError that quotes the bad term."""
    if not text:
        return ()
    reqs = []
    for term in _split_terms(text):
        if m := _SET_RE.match(term):
            values = tuple(v.strip() for v in m.group(4).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(3), values))
        elif m := _CMP_RE.match(term):
            op = "=" if m.group(3) == "==" else m.group(3)
            reqs.append(Requirement(m.group(1), op, (m.group(4),)))
        elif m := _EXISTS_RE.match(term):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise bad_request(
                f"unable to parse requirement {term.strip()!r} in labelSelector {text!r}: "
                "use key=value, key!=value, key in (a,b), key notin (a,b), key or !key"
            )
    return tuple(reqs)


def _path(*parts: str) -> Callable[[Mapping[str, Any]], str | None]:
    def get(obj: Mapping[str, Any]) -> str | None:
        cur: Any = obj
        for part in parts:
            if not isinstance(cur, Mapping) or part not in cur:
                return None
            cur = cur[part]
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return None if cur is None else str(cur)

    return get


_COMMON = {"metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace")}
_INVOLVED = {
    f"involvedObject.{f}": _path("involvedObject", f)
    for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
}
FIELDS: dict[str, dict[str, Callable[[Mapping[str, Any]], str | None]]] = {
    "Pod": {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
    },
    "Event": {**_INVOLVED, "reason": _path("reason"), "type": _path("type"), "source": _path("source", "component")},
    "Secret": {"type": _path("type")},
    "Node": {"spec.unschedulable": _path("spec", "unschedulable")},
    "Namespace": {"status.phase": _path("status", "phase")},
    "Job": {"status.successful": _path("status", "succeeded")},
}


@dataclass(frozen=True)
class FieldRequirement:
    """One term of a field selector."""

    field: str
    op: str  # "=" or "!="
    value: str


def parse_field_selector(text: str | None, kind: str) -> tuple[FieldRequirement, ...]:
    """Parse a ``fieldSelector`` for objects of ``kind``; unknown fields are a 400 as on a real server."""
    if not text:
        return ()
    out = []
    known = {**_COMMON, **FIELDS.get(kind, {})}
    for term in _split_terms(text):
        m = re.fullmatch(r"\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not m:
            raise bad_request(f"invalid field selector term {term!r}: use field=value or field!=value")
        if m.group(1) not in known:
            raise bad_request(
                f'field label not supported: {m.group(1)} (for {kind} the sandbox, like the API server, '
                f"supports {', '.join(sorted(known))})"
            )
        out.append(FieldRequirement(m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
    return tuple(out)


@dataclass(frozen=True)
class Selector:
    """A parsed label plus field selector; empty matches everything."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None, kind: str) -> Selector:
        """Parse both query parameters of a list or watch request."""
        return cls(parse_label_selector(label_selector), parse_field_selector(field_selector, kind))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` satisfies every label and field term."""
        labels = obj.get("metadata", {}).get("labels") or {}
        if not all(r.matches(labels.get(r.key)) for r in self.labels):
            return False
        kind = obj.get("kind", "")
        known = {**_COMMON, **FIELDS.get(kind, {})}
        for f in self.fields:
            value = known[f.field](obj) if f.field in known else None
            equal = (value or "") == f.value
            if equal != (f.op == "="):
                return False
        return True
