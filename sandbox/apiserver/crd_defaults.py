"""Structural defaulting of custom resources, as kube-apiserver applies a CRD's ``default`` values
(apiextensions-apiserver ``pkg/apiserver/schema/defaulting``): a missing property whose schema has a
``default`` gets it, a ``null`` where the schema is not ``nullable`` and has a default is replaced by it, and
the walk goes on into what is there (object properties, array items, ``additionalProperties``), defaults
included, so nested defaults of a defaulted object apply too. Done on every create and update, before
admission, so webhooks and validation see the defaulted object (as they do on a real server).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def apply(schema: Mapping[str, Any], value: Any) -> None:
    """Fill ``value`` (an object of the CRD's kind, changed in place) with its schema's defaults."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name, sub in props.items():
            if "default" not in sub:
                continue
            if name not in value or (value[name] is None and not sub.get("nullable")):
                value[name] = copy.deepcopy(sub["default"])
        for name, item in value.items():
            sub = props.get(name)
            if sub is None and isinstance(schema.get("additionalProperties"), Mapping):
                sub = schema["additionalProperties"]
            if sub is not None and name != "metadata":
                apply(sub, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            apply(schema["items"], item)
