"""Serialised JSON bodies kept until what they were built from changes: the hot endpoints' answers.

``api/inventory`` and ``api/admin/clusters`` are asked hundreds of times a second on a big hub, but what
they answer only changes on a watch event. Building and serialising them per request was a quarter of the
service's time, so each is serialised once per key (the inventory's generation, plus what else it depends
on) with its ETag, and sent as bytes until the key changes. Bodies are kept per endpoint, never per user:
only answers that are the same for everyone allowed to ask may be kept here, and the handler checks who
asks before it looks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Body:
    """One answer as sent: the JSON bytes and their ETag (a quoted hash, as tornado computes it)."""

    data: bytes
    etag: str


def serialise(value: Any) -> Body:
    """``value`` as the JSON API sends it (``default=str`` for dates), with its ETag."""
    data = json.dumps(value, default=str).encode()
    return Body(data, f'"{hashlib.sha1(data).hexdigest()}"')  # noqa: S324 - an ETag, not a security hash


class BodyCache:
    """The last body of each endpoint with the key it was built under. Used from the event loop only, so it
    takes no lock."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Hashable, Body]] = {}

    def get(self, endpoint: str, key: Hashable, build: Callable[[], Any]) -> Body:
        """The body of ``endpoint`` for ``key``: kept from before when the key is the same, else ``build()``
        serialised (and kept, replacing the older one)."""
        held = self._held.get(endpoint)
        if held is not None and held[0] == key:
            return held[1]
        body = serialise(build())
        self._held[endpoint] = (key, body)
        return body
