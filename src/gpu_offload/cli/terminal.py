"""Where a script's run shows up in a shell: its streams on ours, our notices on stderr, exit codes."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..engine.engine import Outcome
from ..engine.errors import RemoteError
from ..runner.frames import Metrics
from .text import terminal_text

INTERRUPTED_EXIT = 130
"""What a shell reports for a command ended by Ctrl-C (128 + SIGINT)."""
TIMEOUT_EXIT = 124
"""What coreutils' ``timeout`` returns when the time ran out."""
PREFIX = "gpu-offload: "
class TerminalSink:
    """The run's stdout and stderr on ours, flushed per write; rich outputs as their text form."""

    def __init__(self) -> None:
        self._notes: set[str] = set()

    def stream(self, name: str, text: str) -> None:
        """Write to our own stream: everything a run shows in the shell passes here, as text only."""
        target = sys.stderr if name == "stderr" else sys.stdout
        target.write(terminal_text(text))
        target.flush()

    def display(self, data: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        """A figure or table: its ``text/plain`` form (a shell shows no images)."""
        text = str(data.get("text/plain", ""))
        rich = sorted(mime for mime in data if mime != "text/plain")
        self.stream("stdout", f"{text}{' ' if text and rich else ''}{'[' + ', '.join(rich) + ']' if rich else ''}\n")

    def notice(self, text: str) -> None:
        """Progress and warnings of ours, on stderr so the script's stdout stays clean for pipes."""
        self.stream("stderr", f"{PREFIX}{text}\n")

    def metrics(self, metrics: Metrics) -> None:
        """The no-GPU note, once."""
        if metrics.note and metrics.note not in self._notes:
            self._notes.add(metrics.note)
            self.notice(metrics.note)


def exit_code(outcome: Outcome) -> int:
    """The shell exit code of a finished run, as ``python SCRIPT`` would end (``sys.exit(n)`` gives ``n``)."""
    if outcome.status == "ok":
        return 0
    if outcome.status in ("interrupted", "cancelled"):
        return INTERRUPTED_EXIT
    if outcome.status == "timeout":
        return TIMEOUT_EXIT
    error = outcome.error
    if isinstance(error, RemoteError) and error.ename == "SystemExit":
        # sys.exit(3) arrives as "3"; sys.exit("message") prints the message and ends with 1, as Python does
        return int(error.evalue) if error.evalue.lstrip("-").isdigit() else 1
    return 1


def report(outcome: Outcome, sink: TerminalSink) -> None:
    """Say why a run that did not succeed ended: the script's traceback, or our sentence."""
    error = outcome.error
    if isinstance(error, RemoteError):
        if error.ename == "SystemExit":
            if not error.evalue.lstrip("-").isdigit() and error.evalue != "None":
                sink.stream("stderr", error.evalue + "\n")
            return
        sink.stream("stderr", "".join(error.traceback) or f"{error.ename}: {error.evalue}\n")
    elif error is not None:
        sink.notice(str(error))
