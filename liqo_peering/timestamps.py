"""Times as the Kubernetes API writes them (RFC 3339: ``2026-11-22T01:02:03Z``, maybe with a fraction).

Parsed with python-dateutil's ISO 8601 parser, as the Kubernetes client parses them itself (the sandbox,
which imports nothing of the project, calls the same parser directly).
"""

from __future__ import annotations

from datetime import datetime, timezone

from dateutil.parser import isoparse


def parse_time(text: str | None) -> datetime | None:
    """``text`` as a UTC datetime, or None when it is empty; ValueError when it is not a time."""
    if not text:
        return None
    return isoparse(text).astimezone(timezone.utc)


def rfc3339(epoch: float | None) -> str | None:
    """Seconds since the epoch as an RFC 3339 UTC time with milliseconds (``2026-11-27T10:12:05.123Z``), what
    every ``--json`` listing prints; None stays None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
