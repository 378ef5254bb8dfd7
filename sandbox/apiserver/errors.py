"""API errors as the real API server reports them: a ``Status`` object with a reason, a code and details.

Every failure inside the sandbox raises :class:`ApiError`; the HTTP layer turns it into the JSON body and
status code a Kubernetes client expects (the official client parses ``reason`` and ``details``, kubectl
prints ``message``). In-process callers (controllers, admission hooks of part 2) catch it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NOT_FOUND = "the server could not find the requested resource"
"""kube-apiserver's exact message for a resource or path it does not serve."""


@dataclass(frozen=True)
class Cause:
    """One entry of ``details.causes``: which field is wrong and why."""

    reason: str
    message: str
    field: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"message": self.message}
        if self.reason:  # omitempty, as a failed webhook call's cause has none
            out["reason"] = self.reason
        if self.field:
            out["field"] = self.field
        return out


@dataclass(eq=False)  # not frozen: contextlib and asyncio set __traceback__ on exceptions
class ApiError(Exception):
    """A failed API call, carrying everything the ``Status`` body needs."""

    code: int
    reason: str
    message: str
    name: str = ""
    group: str = ""
    kind: str = ""
    causes: tuple[Cause, ...] = field(default=())
    retry_after: int = 0

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        """The ``Status`` object (kind Status, apiVersion v1) a real API server sends for this error."""
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.to_dict() for c in self.causes]
        if self.retry_after:
            details["retryAfterSeconds"] = self.retry_after
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if details:
            body["details"] = details
        body["code"] = self.code  # metav1.Status's field order, as clients print the body: details before code
        return body


def _what(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> ApiError:
    """404 for a named object, worded like the API server (``pods "x" not found``)."""
    return ApiError(404, "NotFound", f'{_what(group, plural)} "{name}" not found', name, group, plural)


def already_exists(group: str, plural: str, name: str) -> ApiError:
    """409 on create of a name that is taken."""
    msg = f'{_what(group, plural)} "{name}" already exists'
    return ApiError(409, "AlreadyExists", msg, name, group, plural)


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    """409 when the caller's resourceVersion is stale: re-read the object and apply the change again."""
    msg = (
        f'Operation cannot be fulfilled on {_what(group, plural)} "{name}": {why}; '
        "please apply your changes to the latest version and try again"
    )
    return ApiError(409, "Conflict", msg, name, group, plural)


def invalid(group: str, kind: str, name: str, causes: tuple[Cause, ...]) -> ApiError:
    """422 Invalid with one cause per bad field, as admission and schema validation report it."""
    # the message as apimachinery's aggregate error prints the causes: each distinct one once, in brackets when
    # there are several
    messages = list(dict.fromkeys(f"{c.field}: {c.message}" if c.field else c.message for c in causes))
    text = ": " + (messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]") if messages else ""
    msg = f'{kind}.{group or ""}'.rstrip(".") + f' "{name}" is invalid{text}'
    return ApiError(422, "Invalid", msg, name, group, kind, causes)


def bad_request(message: str) -> ApiError:
    """400 for a malformed request (unparsable body, bad selector, unknown parameter value)."""
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    """410 for a watch resumed from a resourceVersion the server no longer remembers: list again."""
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    """405 for a verb a resource does not support."""
    return ApiError(405, "MethodNotAllowed", message)


def forbidden(group: str, plural: str, name: str, message: str) -> ApiError:
    """403, e.g. creating an object in a namespace that is being deleted."""
    return ApiError(403, "Forbidden", message, name, group, plural)

