"""Keeping the frame nonce to the runner: it arrives on a pipe, and the process cannot be inspected.

Whoever knows the nonce and can write to the engine's channel can forge frames (variables, a ``done`` that
hides an error). A subprocess of the cell runs under the runner's uid, so anything the runner's uid may read
is open to it: ``/proc/<runner>/environ`` (``os.environ.pop`` does not change it), the frame fd through
``/proc/<runner>/fd/N``, and the memory through ``/proc/<runner>/mem``. The nonce therefore never travels
in the environment, and the runner clears its "dumpable" flag, which makes the kernel own those files by
root and refuse ``ptrace`` access to other processes of the same uid.
"""

from __future__ import annotations

import json
import os
import sys

PR_SET_DUMPABLE = 4
"""From ``<linux/prctl.h>``."""
MAX_GREETING = 200
"""Longest first command a session runner reads (the greeting is under 80 bytes)."""


def make_undumpable() -> bool:
    """Clear the process's dumpable flag (Linux); returns whether it is now clear. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # a libc without prctl: nothing to do
        return False


def greeting(nonce: str, ranks: dict[str, int] | None = None) -> bytes:
    """The first line an engine writes to a session runner's stdin; ``ranks`` (a bundle's ``ranks`` field)
    makes the runner a distributed session's node launcher."""
    command: dict[str, object] = {"op": "start", "nonce": nonce}
    if ranks is not None:
        command["ranks"] = ranks
    return json.dumps(command).encode("ascii") + b"\n"


def read_greeting(fd: int = 0) -> tuple[str, dict[str, int] | None]:
    """The nonce (and the ``ranks`` of a distributed session, else ``None``) from the session's first
    command line on ``fd``; ``ValueError`` saying what was wrong.

    Read a byte at a time: the commands after it stay in the pipe for the session's own reader.
    """
    line = bytearray()
    while len(line) <= MAX_GREETING:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    try:
        command = json.loads(bytes(line))
        if command.get("op") == "start" and isinstance(command.get("nonce"), str):
            ranks = command.get("ranks")
            return str(command["nonce"]), (dict(ranks) if isinstance(ranks, dict) else None)
    except (ValueError, AttributeError):
        pass
    raise ValueError(
        f"the first line on stdin must be {{\"op\": \"start\", \"nonce\": NONCE}}, got {bytes(line[:80])!r}"
    )


def read_stdin_bundle(fd: int = 0) -> bytes:
    """All of ``fd`` (a one-shot runner given ``--bundle -``): the bundle never sits in a named file."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
