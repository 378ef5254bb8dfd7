"""The one way a span of time is said: to the second for a clock the user watches, to the minute in a sentence."""

from __future__ import annotations

from gpu_offload.liqo_peering.wording import duration


def test_a_clock_shows_its_seconds_below_an_hour_and_rounds_to_the_nearest_one() -> None:
    spans = (0.4, 0.6, 59, 60, 72, 3599.6, 3720, -5)
    assert [duration(s) for s in spans] == [
        "0 s", "1 s", "59 s", "1 min 0 s", "1 min 12 s", "1 h 0 min", "1 h 2 min", "0 s"]


def test_a_span_said_once_drops_the_seconds_from_a_minute_on() -> None:
    assert [duration(s, "min") for s in (59, 59.6, 72, 3720)] == ["59 s", "1 min", "1 min", "1 h 2 min"]
