"""``limit`` and ``continue`` on list requests, as clients page through big collections (kubectl asks
for 500 at a time). The token carries the first page's resourceVersion and the last (namespace, name)
sent; later pages read the current state after that key rather than a snapshot at that version (a real
server reads its snapshot): objects changed between pages show their newer version."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from .errors import bad_request

Obj = dict[str, Any]


def _key(obj: Obj) -> tuple[str, str]:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def encode(rv: str, last: tuple[str, str]) -> str:
    """The opaque ``metadata.continue`` token."""
    return base64.urlsafe_b64encode(json.dumps({"rv": rv, "after": list(last)}).encode()).decode()


def decode(token: str) -> tuple[str, tuple[str, str]]:
    """(resourceVersion of the first page, key after which to continue); 400 for a token not ours."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["rv"]), (str(data["after"][0]), str(data["after"][1]))
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error) as exc:
        raise bad_request(f"continue token {token[:20]!r} is not valid: start the list again without it") from exc


def page(listing: Obj, limit: int | None, token: str | None) -> Obj:
    """Cut a full ``<Kind>List`` (items sorted by namespace and name) to one page, in place."""
    items = listing["items"]
    if token:
        rv, after = decode(token)
        items = [o for o in items if _key(o) > after]
        listing["metadata"]["resourceVersion"] = rv
    if limit is not None and limit < 0:
        raise bad_request(f"limit={limit}: give a positive number of items, or 0 for all")
    if limit and len(items) > limit:
        rest = len(items) - limit
        items = items[:limit]
        listing["metadata"]["continue"] = encode(listing["metadata"]["resourceVersion"], _key(items[-1]))
        listing["metadata"]["remainingItemCount"] = rest
    listing["items"] = items
    return listing
