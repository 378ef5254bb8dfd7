"""The one way untrusted text is shown (Kueue's events and conditions, a donor's type names, a Job's annotations):
one printable line, bounded, and bounded work however much was sent."""

from __future__ import annotations

from gpu_offload.liqo_peering.untrusted_text import MAX_SHOWN, shown


def test_control_characters_and_white_space_become_one_space_on_one_line() -> None:
    forged = "\x1b[2J\r\nrun 7\tfailed\x07  \n\x1b]0;title\x07done\u2028 "
    assert shown(forged) == "[2J run 7 failed ]0;title done"  # no escape, newline or bell survives


def test_an_ellipsis_says_that_more_was_sent_than_is_shown() -> None:
    assert shown("x" * MAX_SHOWN) == "x" * MAX_SHOWN
    assert shown("x" * (MAX_SHOWN + 1)) == "x" * MAX_SHOWN + "..."
    assert shown("a \n b", 3) == "a b"  # folded white space does not count against the limit
    assert shown(None) == "None" and shown(42, 1) == "4..."


def test_ten_megabytes_are_cut_after_reading_only_their_start() -> None:
    # "hidden" would be shown (white space folds away) had the whole text been read
    assert shown(" " * 10_000_000 + "hidden", 20) == "..."
