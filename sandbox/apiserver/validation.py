"""Schema validation of every object written: built-in kinds against the real schema of a pinned
Kubernetes version (the JSON schemas shipped by ``kubernetes-validate``, strict: unknown fields are
errors), custom resources against their CRD's ``openAPIV3Schema`` (also strict, except below
``x-kubernetes-preserve-unknown-fields``). Nothing is skipped silently: a built-in kind without a schema
is an error naming the kind, not a pass.

Errors become the causes of a 422 Invalid, with Kubernetes-style field paths (``spec.containers[0].image``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
import kubernetes_validate.utils as kv
from referencing import Registry, Resource

from .errors import Cause
from .resources import ResourceType

#: Kubernetes version whose schemas built-in objects are validated against (matches client 36).
KUBERNETES_VERSION = "1.36.0"


@functools.cache
def _builtin_validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    # Same files and layout kubernetes_validate.validate() uses, built once: validate() re-reads the
    # megabyte of shared definitions on every call, too slow for an API server.
    group_version = api_version.split("/")
    name = f"{kind.lower()}-{group_version[0].split('.')[0]}-{group_version[1]}" if len(
        group_version) == 2 else f"{kind.lower()}-{api_version}"
    folder = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict"
    try:
        schema = kv.schema_contents(f"{folder}/{name}.json", KUBERNETES_VERSION)
    except FileNotFoundError as exc:
        raise LookupError(
            f"no {KUBERNETES_VERSION} schema for {api_version} {kind} in kubernetes-validate; "
            "the sandbox refuses to store objects it cannot validate"
        ) from exc
    defs = kv.schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION)
    registry: Registry[Any] = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _strict_crd_schema(node: Any, top: bool = False) -> Any:
    """An OpenAPI v3 CRD schema as a JSON schema: nullable honoured, unknown fields rejected."""
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in ("properties", "patternProperties"):
            out[k] = {name: _strict_crd_schema(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "not"):
            out[k] = _strict_crd_schema(v)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [_strict_crd_schema(sub) for sub in v]
        else:
            out[k] = v
    if top:
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props["metadata"] = {"type": "object"}
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


@functools.cache
def _crd_validator_cached(rt: ResourceType) -> jsonschema.protocols.Validator:
    return jsonschema.Draft7Validator(_strict_crd_schema(rt.schema, top=True))


def field_path(path: Iterable[Any]) -> str:
    """``['spec', 'containers', 0, 'image']`` -> ``spec.containers[0].image``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _causes(error: jsonschema.ValidationError) -> list[Cause]:
    base = field_path(error.absolute_path)

    def join(name: str) -> str:
        return f"{base}.{name}" if base else name

    inst = error.instance
    if error.validator == "required" and isinstance(inst, Mapping):
        return [Cause("FieldValueRequired", "Required value", join(n))
                for n in error.validator_value if n not in inst]
    if error.validator == "additionalProperties" and error.validator_value is False and isinstance(inst, Mapping):
        allowed = set(error.schema.get("properties", {}))
        return [Cause("FieldValueInvalid", f'unknown field "{n}"', join(n)) for n in inst if n not in allowed]
    if error.validator == "enum":
        supported = ", ".join(f'"{v}"' for v in error.validator_value if v is not None)
        return [Cause("FieldValueNotSupported", f'Unsupported value: "{inst}": supported values: {supported}',
                      base)]
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        types = " or ".join(t for t in wanted if t != "null")
        return [Cause("FieldValueInvalid", f"Invalid value: {inst!r}: must be of type {types}", base)]
    return [Cause("FieldValueInvalid", f"Invalid value: {error.message}", base)]


def _collect(validator: jsonschema.protocols.Validator, obj: Mapping[str, Any]) -> tuple[Cause, ...]:
    causes: list[Cause] = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        # anyOf/oneOf failures carry the detail in their context; report the deepest one
        leaf = max(error.context, key=lambda e: len(e.absolute_path)) if error.context else error
        for cause in _causes(leaf):
            if cause not in causes:
                causes.append(cause)
    return tuple(causes)


def validate_object(rt: ResourceType, obj: Mapping[str, Any]) -> tuple[Cause, ...]:
    """Causes of invalidity of ``obj`` (empty when valid). Raises LookupError for an unvalidatable kind."""
    if rt.custom:
        return _collect(_crd_validator_cached(rt), obj)
    return _collect(_builtin_validator(rt.kind, rt.api_version), obj)
