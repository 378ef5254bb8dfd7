"""Admission: mutating hooks, then schema validation, then validating hooks, as in kube-apiserver.

Extension point (part 2; Liqo's pod webhook, the NamespaceOffloading name check)::

    def add_liqo_toleration(req: AdmissionRequest) -> None:      # mutating: change req.object in place
        req.object["spec"].setdefault("tolerations", []).append({...})

    def offloading_name(req: AdmissionRequest) -> list[Cause]:   # validating: return causes (422) or
        return [] if req.name == "offloading" else [Cause(...)]   # raise an ApiError for another code

    api.admission.add_mutating("pods", add_liqo_toleration)
    api.admission.add_validating("namespaceoffloadings.offloading.liqo.io", offloading_name)

Validating hooks registered for DELETE see the object as stored (``object`` and ``old_object``) and can
refuse its deletion; mutating hooks never run on DELETE. A hook is registered for a resource as ``ResourceType.describe()`` names it (``pods``, ``jobs.batch``,
``virtualnodes.offloading.liqo.io``), optionally with ``/subresource`` (``pods/status``); ``*`` matches
every main resource. Hooks run synchronously inside the API call, under the store lock, in registration
order; they may read the store through the Api they closed over but must not write to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, Cause, invalid
from .resources import ResourceType

OPERATIONS = ("CREATE", "UPDATE", "DELETE")


@dataclass(frozen=True)
class AdmissionRequest:
    """What a hook sees. ``object`` is the dict about to be stored: mutating hooks change it in place."""

    operation: str
    resource: ResourceType
    namespace: str
    name: str
    object: dict[str, Any]
    old_object: dict[str, Any] | None = None
    subresource: str = ""


MutatingHook = Callable[[AdmissionRequest], None]
ValidatingHook = Callable[[AdmissionRequest], "Iterable[Cause] | None"]


@dataclass(frozen=True)
class _Registration:
    target: str
    operations: tuple[str, ...]
    hook: Callable[[AdmissionRequest], Any]


class Admission:
    """The hook chains of one API server."""

    def __init__(self) -> None:
        self._mutating: list[_Registration] = []
        self._validating: list[_Registration] = []

    @staticmethod
    def _check(target: str, operations: tuple[str, ...]) -> None:
        bad = [op for op in operations if op not in OPERATIONS]
        if bad or not target:
            raise ValueError(
                f"admission hook for {target!r} with operations {operations}: name a resource like 'pods' "
                f"or 'jobs.batch' and operations among {OPERATIONS}"
            )

    def add_mutating(self, target: str, hook: MutatingHook,
                     operations: tuple[str, ...] = ("CREATE", "UPDATE")) -> None:
        """Run ``hook`` on writes to ``target`` before validation; it changes ``request.object``."""
        self._check(target, operations)
        self._mutating.append(_Registration(target, operations, hook))

    def add_validating(self, target: str, hook: ValidatingHook,
                       operations: tuple[str, ...] = ("CREATE", "UPDATE")) -> None:
        """Run ``hook`` after schema validation; returned causes reject the write with 422 Invalid."""
        self._check(target, operations)
        self._validating.append(_Registration(target, operations, hook))

    def remove(self, hook: Callable[[AdmissionRequest], Any]) -> None:
        """Unregister ``hook`` from every resource it was added for."""
        self._mutating = [r for r in self._mutating if r.hook is not hook]
        self._validating = [r for r in self._validating if r.hook is not hook]

    @staticmethod
    def _matching(regs: list[_Registration], req: AdmissionRequest) -> list[_Registration]:
        name = req.resource.describe() + (f"/{req.subresource}" if req.subresource else "")
        return [r for r in regs if req.operation in r.operations
                and (r.target == name or (r.target == "*" and not req.subresource))]

    def mutate(self, req: AdmissionRequest) -> bool:
        """Run the mutating hooks registered for this request; True if there were any."""
        hooks = list(self._matching(self._mutating, req))
        for reg in hooks:
            reg.hook(req)
        return bool(hooks)

    def validate(self, req: AdmissionRequest) -> None:
        """Run the validating hooks; raise 422 Invalid with all causes, or the ApiError a hook raised."""
        causes: list[Cause] = []
        for reg in self._matching(self._validating, req):
            causes += list(reg.hook(req) or ())
        if causes:
            rt = req.resource
            raise invalid(rt.group, rt.kind, req.name, tuple(causes))


def reject(req: AdmissionRequest, message: str, code: int = 400, reason: str = "BadRequest") -> ApiError:
    """An ApiError for a hook to raise when 422 Invalid is not the right answer (e.g. 403 Forbidden)."""
    return ApiError(code, reason, f'admission webhook denied {req.resource.kind} "{req.name}": {message}',
                    req.name, req.resource.group, req.resource.plural)
