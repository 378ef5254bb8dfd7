"""Decoding hostile input in a child process (``decode_child.py``): a crash there is a test failure naming the
input, not the end of pytest."""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("decode_child.py")


class ChildDied(AssertionError):
    """The decoder's process ended while decoding: the input crashed the kernel it would have run in."""


class DecodeChild:
    """One long-lived child (importing torch and pandas once), fed one input at a time."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - a file, not a pipe: a chatty child never blocks
        self.process = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._stderr)

    def decode(self, kind: str, data: bytes) -> dict[str, Any]:
        if self.process.poll() is not None:  # a previous input crashed it: the next one gets a fresh child
            self._stderr.close()
            self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        name = kind.encode()
        try:
            self.process.stdin.write(struct.pack("<II", len(name), len(data)) + name + data)
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait(timeout=30)
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            self._stderr.seek(0)
            error = self._stderr.read().decode(errors="replace")[-2000:]
            raise ChildDied(f"decoding {kind} input of {len(data)} bytes ended the process with {how}\n{error}")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()

    def __enter__(self) -> DecodeChild:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
