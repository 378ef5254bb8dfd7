"""A session's idle timeout (pure): the hub's, or a shorter ``--idle-timeout`` the user asks for, never a longer
one; what the cell is told when it changes, and what ``%gpu_offload sessions`` says of the release."""

from __future__ import annotations

import calendar
import time

from gpu_offload.engine.backends.kube.idle import ASKED, HUB, IdleTimeout, IdleTimeouts, release_words


def test_a_session_without_an_ask_has_the_hubs_timeout() -> None:
    timeouts = IdleTimeouts(1800.0)
    assert timeouts.of("train") == IdleTimeout(1800.0, HUB)
    assert timeouts.ask("train", None) is None and timeouts.of("train") == IdleTimeout(1800.0, HUB)


def test_a_shorter_ask_holds_for_that_session_only_and_is_said_once() -> None:
    timeouts = IdleTimeouts(1800.0)
    told = timeouts.ask("train", 300.0)
    assert told == ("session train is released after 5 min idle from now on (--idle-timeout; checkpointed first "
                    "when the cluster has object storage)", False)
    assert timeouts.of("train") == IdleTimeout(300.0, ASKED) and timeouts.of("other") == IdleTimeout(1800.0, HUB)
    assert timeouts.ask("train", 300.0) is None  # the same ask on the next cell: nothing new to say
    timeouts.forget("train")
    assert timeouts.of("train") == IdleTimeout(1800.0, HUB)


def test_a_longer_ask_than_the_hubs_is_capped_with_a_warning() -> None:
    timeouts = IdleTimeouts(1800.0)
    text, warning = timeouts.ask("train", 7200.0) or ("", False)
    assert warning and text.startswith("--idle-timeout 120: the hub's offload.sessionIdleTimeout is 30 min"), text
    assert "session train is released after 30 min idle" in text
    assert timeouts.of("train").seconds == 1800.0
    assert timeouts.ask("train", 7200.0) is None


def test_without_a_hub_timeout_any_ask_holds() -> None:
    timeouts = IdleTimeouts(0.0)
    assert timeouts.of("train").seconds == 0
    assert timeouts.ask("train", 7200.0) is not None and timeouts.of("train") == IdleTimeout(7200.0, ASKED)


def test_the_release_is_said_with_its_time_while_the_session_is_idle() -> None:
    at = calendar.timegm(time.strptime("2026-11-27 16:12:30", "%Y-%m-%d %H:%M:%S"))
    assert release_words(IdleTimeout(600.0, ASKED), at, at - 240.0) == (
        "released after 10 min idle (--idle-timeout): at 16:12:30 UTC, in 4 min, unless a cell comes first")
    assert release_words(IdleTimeout(1800.0, HUB), None, at) == (
        "released after 30 min idle (the hub's offload.sessionIdleTimeout)")  # a cell runs: no timer yet
    assert release_words(IdleTimeout(0.0, HUB), at, at) == ""
