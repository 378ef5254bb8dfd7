"""The three PATCH flavours a Kubernetes client sends, applied to plain dicts.

- ``application/merge-patch+json`` (RFC 7386): objects merge, ``null`` deletes, lists replace.
- ``application/json-patch+json`` (RFC 6902): add, remove, replace, move, copy, test.
- ``application/strategic-merge-patch+json``, modestly: like a merge patch, except the lists below merge
  by their key, as Kubernetes declares them (containers, initContainers, env, ports, volumes, volumeMounts,
  imagePullSecrets, conditions, ownerReferences by uid; a Service's ``spec.ports`` by ``port``, a Node's
  ``status.addresses`` by ``type``), ``metadata.finalizers`` merges as a set, and the
  directives ``$patch: delete`` (in a list item or a map), ``$patch: replace`` (in a map) and
  ``$deleteFromPrimitiveList/<field>`` are honoured. Every other list, ``tolerations`` included, is
  replaced whole, as Kubernetes does for lists without a patch strategy.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, bad_request

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}
SET_LISTS = {"finalizers"}
KIND_MERGE_KEYS: dict[tuple[str, tuple[str, ...]], str] = {
    # (kind, path of the list) -> its key where it differs from MERGE_KEYS, as each type declares it
    ("Service", ("spec", "ports")): "port",
    ("Node", ("status", "addresses")): "type",
    ("Node", ("status", "images")): "",  # atomic
    ("Endpoints", ("subsets",)): "",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _merge_key(kind: str, path: tuple[str, ...]) -> str:
    # "" for a list that is replaced whole
    found = KIND_MERGE_KEYS.get((kind, path))
    return found if found is not None else MERGE_KEYS.get(path[-1], "")


def _merge_keyed_list(target: list[Any], patch: list[Any], key: str, kind: str, path: tuple[str, ...]) -> list[Any]:
    out = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"strategic merge patch: list items merged by {key!r} must carry {key!r}: {item!r}")
        index = next((i for i, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
        elif index is None:
            out.append(strategic_merge_patch({}, item, kind, path))
        else:
            out[index] = strategic_merge_patch(out[index], item, kind, path)
    return out


def strategic_merge_patch(target: Any, patch: Any, kind: str = "", path: tuple[str, ...] = ()) -> Any:
    """Kubernetes strategic merge patch for the lists in ``MERGE_KEYS`` and ``SET_LISTS``; see module doc.

    ``kind`` is the patched object's kind and ``path`` where ``target`` sits in it (list indexes left out):
    a few lists merge by another key in some kinds (``KIND_MERGE_KEYS``).
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            out[field] = [v for v in out.get(field, []) if v not in value]
        elif key.startswith("$"):
            continue  # $retainKeys, $setElementOrder: ordering hints the sandbox does not need
        elif value is None:
            out.pop(key, None)
        elif isinstance(value, list) and _merge_key(kind, (*path, key)) and isinstance(out.get(key), list):
            out[key] = _merge_keyed_list(out[key], value, _merge_key(kind, (*path, key)), kind, (*path, key))
        elif isinstance(value, list) and key in SET_LISTS and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        elif isinstance(value, dict):
            merged = strategic_merge_patch(out.get(key), value, kind, (*path, key))
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        else:
            out[key] = copy.deepcopy(value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for part in parts[:-1]:
        try:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise bad_request(f"json patch: path {path!r} does not exist in the object") from exc
    return cur


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _container(doc, parts, path)
    try:
        return parent[int(parts[-1])] if isinstance(parent, list) else parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise bad_request(f"json patch: path {path!r} does not exist in the object") from exc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _container(doc, parts, path)
    _get(doc, path)
    return parent.pop(int(parts[-1]) if isinstance(parent, list) else parts[-1])


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _container(doc, parts, path)
    if isinstance(parent, list):
        index = len(parent) if parts[-1] == "-" else int(parts[-1])
        if index > len(parent):
            raise bad_request(f"json patch: index in {path!r} is out of range")
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[parts[-1]] = value
    else:
        raise bad_request(f"json patch: the parent of {path!r} is neither an object nor a list")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch; a failed ``test`` or a missing path is a 400 naming the operation."""
    if not isinstance(ops, list):
        raise bad_request("json patch: the body must be a JSON list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = _remove(doc, op["from"]) if kind == "move" else copy.deepcopy(_get(doc, op["from"]))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch: test operation on {path!r} failed: the value differs")
        else:
            raise bad_request(f"json patch: unknown op {kind!r}; use add, remove, replace, move, copy or test")
    return doc


def apply_patch(target: Any, patch: Any, content_type: str) -> Any:
    """Dispatch on the request's Content-Type; an unknown type is a 415 naming the supported ones."""
    ctype = content_type.split(";")[0].strip()
    if ctype == MERGE:
        return merge_patch(target, patch)
    if ctype == STRATEGIC:
        return strategic_merge_patch(target, patch, target.get("kind", "") if isinstance(target, dict) else "")
    if ctype == JSON:
        return json_patch(target, patch)
    raise ApiError(
        415, "UnsupportedMediaType",
        f"the body of the request was in an unknown format {ctype!r} (server-side apply is not emulated); "
        f"accepted media types are {JSON}, {MERGE}, {STRATEGIC}",
    )
