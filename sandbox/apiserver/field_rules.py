"""Checks kube-apiserver makes beyond the JSON schema, for the fields this project writes: label keys and
values, annotation size, Secret and ConfigMap size (1 MiB), container and volume names, env var names,
resource quantities and the pod's request <= limit rule. Each finding is a 422 cause with its field path,
worded like the real validation, so a manifest that a real cluster would refuse is refused here too."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from .errors import Cause
from .resources import ResourceType

MAX_DATA_BYTES = 1024 * 1024
MAX_ANNOTATION_BYTES = 256 * 1024
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# kube-apiserver's quantity grammar: stricter than the client's parse_quantity, which also takes "1K",
# " 1" or "1.5e2m"; so admission checks the spelling here and leaves the arithmetic to parse_quantity.
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")


def _label_key_causes(key: str, field: str) -> list[Cause]:
    prefix, _, name = key.rpartition("/")
    bad = not _LABEL_NAME.match(name) or len(name) > 63
    bad = bad or (bool(prefix) and (not _DNS_SUBDOMAIN.match(prefix) or len(prefix) > 253))
    if not bad:
        return []
    return [Cause("FieldValueInvalid", f'Invalid value: "{key}": name part must consist of alphanumeric '
                  "characters, '-', '_' or '.', and must start and end with an alphanumeric character "
                  "(at most 63 characters), with an optional DNS subdomain prefix and '/'", field)]


def _metadata_causes(meta: Mapping[str, Any]) -> Iterator[Cause]:
    for key, value in (meta.get("labels") or {}).items():
        yield from _label_key_causes(key, "metadata.labels")
        if not isinstance(value, str) or (value and (not _LABEL_NAME.match(value) or len(value) > 63)):
            yield Cause("FieldValueInvalid",
                        f'Invalid value: "{value}": a valid label must be an empty string or consist of '
                        "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                        "character (at most 63 characters)", f"metadata.labels.{key}")
    annotations = meta.get("annotations") or {}
    for key in annotations:
        yield from _label_key_causes(key, "metadata.annotations")
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > MAX_ANNOTATION_BYTES:
        yield Cause("FieldValueTooLong", f"Too long: must have at most {MAX_ANNOTATION_BYTES} bytes",
                    "metadata.annotations")


def _data_causes(obj: Mapping[str, Any], kind: str) -> Iterator[Cause]:
    size = 0
    for field in ("data", "binaryData"):
        for key, value in (obj.get(field) or {}).items():
            if not re.match(r"^[-._a-zA-Z0-9]+$", key):
                yield Cause("FieldValueInvalid", f'Invalid value: "{key}": a valid config key must consist of '
                            "alphanumeric characters, '-', '_' or '.'", f"{field}[{key}]")
            if kind == "Secret" or field == "binaryData":
                try:
                    size += len(base64.b64decode(str(value), validate=True))
                except (binascii.Error, ValueError):
                    yield Cause("FieldValueInvalid", "Invalid value: illegal base64 data", f"{field}[{key}]")
            else:
                size += len(str(value).encode())
    if size > MAX_DATA_BYTES:
        yield Cause("FieldValueTooLong", f"Too long: must have at most {MAX_DATA_BYTES} bytes", "data")


def quantity(text: Any) -> Decimal | None:
    """A Kubernetes quantity's value ("1.5Gi", "500m", 2), or None if it is not one."""
    raw = str(text)
    return parse_quantity(raw) if _QUANTITY.match(raw) else None


def _container_causes(containers: list[Any], path: str) -> Iterator[Cause]:
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping):
            continue
        here = f"{path}[{i}]"
        name = str(c.get("name", ""))
        if name and (not _DNS_LABEL.match(name) or len(name) > 63):
            yield Cause("FieldValueInvalid", f'Invalid value: "{name}": a lowercase RFC 1123 label is required',
                        f"{here}.name")
        for j, env in enumerate(c.get("env") or []):
            if isinstance(env, Mapping) and not _ENV_NAME.match(str(env.get("name", ""))):
                yield Cause("FieldValueInvalid", f'Invalid value: "{env.get("name")}": a valid environment '
                            "variable name must consist of alphabetic characters, digits, '_', '-', or '.', "
                            "and must not start with a digit", f"{here}.env[{j}].name")
        yield from _resource_causes(c.get("resources") or {}, f"{here}.resources")


def _resource_causes(resources: Mapping[str, Any], path: str) -> Iterator[Cause]:
    values: dict[str, dict[str, Decimal]] = {}
    for kind in ("requests", "limits"):
        for res, amount in (resources.get(kind) or {}).items():
            value = quantity(amount)
            if value is None:
                yield Cause("FieldValueInvalid", f'Invalid value: "{amount}": quantities must match the regular '
                            r"expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'", f"{path}.{kind}[{res}]")
            elif value < 0:
                yield Cause("FieldValueInvalid", f'Invalid value: "{amount}": must be greater than or equal to 0',
                            f"{path}.{kind}[{res}]")
            else:
                values.setdefault(kind, {})[res] = value
    for res, request in values.get("requests", {}).items():
        limit = values.get("limits", {}).get(res)
        if limit is not None and request > limit:
            yield Cause("FieldValueInvalid", f'Invalid value: "{resources["requests"][res]}": must be less than or '
                        f"equal to {res} limit of {resources['limits'][res]}", f"{path}.requests[{res}]")
        if "/" in res and limit is not None and request != limit:  # extended resources (nvidia.com/gpu)
            yield Cause("FieldValueInvalid", f'Invalid value: "{resources["requests"][res]}": must be equal to '
                        f"{res} limit of {resources['limits'][res]}", f"{path}.requests[{res}]")


def _pod_spec_causes(spec: Mapping[str, Any], path: str) -> Iterator[Cause]:
    yield from _container_causes(spec.get("containers") or [], f"{path}.containers")
    yield from _container_causes(spec.get("initContainers") or [], f"{path}.initContainers")
    names = [v.get("name") for v in spec.get("volumes") or [] if isinstance(v, Mapping)]
    for i, name in enumerate(names):
        if names.index(name) != i:
            yield Cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"{path}.volumes[{i}].name")


def field_causes(rt: ResourceType, obj: Mapping[str, Any]) -> tuple[Cause, ...]:
    """What the real API server's validation would reject in ``obj`` beyond its schema."""
    causes = list(_metadata_causes(obj.get("metadata") or {}))
    if rt.custom:
        return tuple(causes)
    if rt.kind in ("Secret", "ConfigMap"):
        causes += _data_causes(obj, rt.kind)
    elif rt.kind == "Pod":
        causes += _pod_spec_causes(obj.get("spec") or {}, "spec")
    elif rt.kind == "Job":
        causes += _pod_spec_causes(((obj.get("spec") or {}).get("template") or {}).get("spec") or {},
                                   "spec.template.spec")
    return tuple(causes)
