"""``fieldValidation``: what a write does with fields the schema does not know, as kube-apiserver decides.

- ``Warn`` (the server's default when the query has none): the unknown fields are dropped from the stored
  object and each is named in a ``Warning: 299 - "unknown field \\"spec.foo\\""`` response header;
- ``Ignore``: dropped silently;
- ``Strict`` (kubectl's default): the write fails with 400 BadRequest
  ``strict decoding error: unknown field "spec.foo", ...`` and nothing is stored.

The HTTP layer opens a :func:`request_scope` per request; the API reads the mode and adds warnings to it.
Writes outside any request (the sandbox's own controllers) are Strict, so a controller bug fails loudly.
The default for requests without the parameter is ``api.field_validation``: Warn, as kube-apiserver; the
project's own test fixtures set Strict, so a manifest the project builds with a misspelt field fails its
test instead of losing the field with a warning nobody reads.
Left out: duplicate fields in the JSON body (Python's parser keeps the last one, as Warn/Ignore would).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, Cause, bad_request

MODES = ("Ignore", "Warn", "Strict")
_UNKNOWN = re.compile(r'^unknown field "(.+)"$')


@dataclass
class RequestScope:
    """The field validation mode of one request and the warnings its writes produced."""

    mode: str = "Strict"
    warnings: list[str] = field(default_factory=list)

    def headers(self) -> list[str]:
        """The ``Warning`` header values (RFC 7234 form, code 299, as kube-apiserver sends them)."""
        return [f"299 - {json.dumps(w)}" for w in self.warnings]


_SCOPE: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("field_validation", default=None)


@contextlib.contextmanager
def request_scope(query_value: str | None, default: str = "Warn") -> Iterator[RequestScope]:
    """The scope of one HTTP request; ``query_value`` is its ``fieldValidation`` (None: ``default``)."""
    mode = query_value or default
    if mode not in MODES:
        raise bad_request(f'fieldValidation={mode!r} is not supported: use "Ignore", "Warn" or "Strict"')
    scope = RequestScope(mode)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def _path(field_path: str) -> list[str | int]:
    # "spec.containers[0].gpus" -> ["spec", "containers", 0, "gpus"]
    out: list[str | int] = []
    for part in field_path.split("."):
        name, *indexes = part.split("[")
        if name:
            out.append(name)
        out += [int(i.rstrip("]")) for i in indexes]
    return out


def _drop(obj: Any, path: list[str | int]) -> None:
    for step in path[:-1]:
        try:
            obj = obj[step]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(obj, dict):
        obj.pop(path[-1], None)


def apply(obj: dict[str, Any], causes: tuple[Cause, ...]) -> tuple[Cause, ...]:
    """Handle the unknown-field causes of validating ``obj`` per the current mode; returns the others.

    Strict raises the 400; Warn and Ignore remove the fields from ``obj`` (in place).
    """
    unknown = [c.field for c in causes if _UNKNOWN.match(c.message)]
    if not unknown:
        return causes
    scope = _SCOPE.get() or RequestScope()
    named = [f'unknown field "{f}"' for f in unknown]
    if scope.mode == "Strict":
        raise ApiError(400, "BadRequest", "strict decoding error: " + ", ".join(named))
    for name in unknown:
        _drop(obj, _path(name))
    if scope.mode == "Warn":
        scope.warnings += [w for w in named if w not in scope.warnings]
    return tuple(c for c in causes if not _UNKNOWN.match(c.message))
