"""The servers ``gpu-offload lab`` starts as child processes (JupyterLab, or JupyterHub with ``--hub``): a
free port, whether one answers, waiting until it does and stopping it with what it started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RUNS_EXTENSION = "gpu_offload.magics.runs_api"
"""The Jupyter server extension of the runs REST API, on in every server the command starts."""
STOP_GRACE = 60.0
"""Seconds JupyterLab or JupyterHub gets to stop its kernels or servers after SIGTERM."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proxy_command() -> str | None:
    """JupyterHub's proxy: on PATH, else where the repository's CI installs it."""
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    ci = Path(__file__).resolve().parents[3] / ".ci" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    return str(ci) if ci.exists() else None


@dataclass(frozen=True)
class Child:
    """A server this command started: its process (leader of its own process group) and its URL."""

    process: subprocess.Popen[bytes]
    url: str
    """What the user opens (with its token, for JupyterLab)."""
    ready: Callable[[], bool]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def wait_ready(child: Child, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not child.ready():
        if child.process.poll() is not None:
            raise RuntimeError(f"it exited with code {child.process.returncode}; its log ({log}) ends:\n"
                               + log.read_text(errors="replace")[-2000:])
        if time.monotonic() > deadline:
            raise RuntimeError(f"it did not answer within {timeout:.0f} s; see its log {log}")
        time.sleep(0.3)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child (it stops its kernels or servers), SIGKILL its process group after the grace."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of its group outlived it
    process.wait()
