"""Text someone else wrote, made fit to show: the one way every layer prints it (pure).

A donor's type names and reasons, Kueue's events and Workload conditions, a Job's annotations reach the user's
notebook, terminal or page. Whoever wrote them may have put terminal escapes in them, a newline that forges a line
of ours, or a megabyte: what is shown is printable, on one line and bounded, and so is the work of making it so.
"""

from __future__ import annotations

MAX_SHOWN = 300
"""Characters of an untrusted text (an event's message, a name) shown at most."""
_LOOKED_AT = 4
"""Only the first ``_LOOKED_AT * limit`` characters are read, so the work is bounded whatever was sent (white
space folded away cannot make a shown text longer than it would be without it)."""


def shown(text: object, limit: int = MAX_SHOWN) -> str:
    """Untrusted ``text`` fit to print on one line: each run of white space and control characters becomes one
    space (none at either end), at most ``limit`` characters, and an ellipsis after them when there was more."""
    raw = str(text)
    read = raw[:limit * _LOOKED_AT]
    one_line = " ".join("".join(c if c.isprintable() else " " for c in read).split())
    more = len(one_line) > limit or len(raw) > len(read)
    return one_line[:limit] + ("..." if more else "")
