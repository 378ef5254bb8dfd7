"""Small words every front end says the same way: a span of time, a place in a line."""

from __future__ import annotations


def ordinal(n: int) -> str:
    """1 -> ``1st``, 2 -> ``2nd``, 11 -> ``11th``, 23 -> ``23rd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def duration(seconds: float) -> str:
    """``72`` -> ``1 min 12 s``; ``3720`` -> ``1 h 2 min``."""
    whole = int(max(seconds, 0))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
