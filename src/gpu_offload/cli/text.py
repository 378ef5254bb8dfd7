"""What a run wrote, made fit for a terminal: every command that prints a run's text passes it here.

A donor's pod (or whoever wrote a stored log) chooses every byte of a run's output; a terminal acts on escape
sequences in it, so they are shown, not obeyed.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""Control characters but tab, newline and carriage return (a progress bar redraws its line). An escape
sequence can write the clipboard (OSC 52), retitle or clear the terminal; even colours can hide text
(conceal, black on black), so none is kept."""


def terminal_text(text: str) -> str:
    """Text a run wrote, fit for our terminal: every other control character shown as U+FFFD."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", text)
