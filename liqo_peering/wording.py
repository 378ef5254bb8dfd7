"""Small words every front end says the same way: a span of time, a place in a line."""

from __future__ import annotations

from typing import Literal


def ordinal(n: int) -> str:
    """1 -> ``1st``, 2 -> ``2nd``, 11 -> ``11th``, 23 -> ``23rd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def duration(seconds: float, smallest: Literal["s", "min"] = "s") -> str:
    """A span of time to the nearest second: ``72`` -> ``1 min 12 s``, ``3720`` -> ``1 h 2 min``.

    ``smallest="min"`` drops the seconds from a minute on (``72`` -> ``1 min``): for a span said once in a
    sentence (how long a run ran, a timeout, a countdown to a release), whose seconds are stale when read; a clock
    the user watches tick (the wait in line) keeps them."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if not minutes:
        return f"{secs} s"
    return f"{minutes} min" if smallest == "min" else f"{minutes} min {secs} s"
