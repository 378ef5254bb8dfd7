"""Peering through ``liqoctl``: the exact command, and running it when the operator allowed it.

Full peering needs near-admin rights on both clusters and several Liqo modules; the project never
re-implements it. The uploaded kubeconfig lives in a private temporary folder only while liqoctl runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import InvalidRequest

from .actions import Peering

TIMEOUT_SECONDS = 600
REMOTE_KUBECONFIG_PLACEHOLDER = "<kubeconfig of cluster {cluster}>"


def command(action: Peering, remote_kubeconfig: str | None = None) -> list[str]:
    """``liqoctl peer|unpeer --remote-kubeconfig FILE [--resource=nvidia.com/gpu=N]`` (FILE a placeholder when
    only showing it)."""
    path = remote_kubeconfig or REMOTE_KUBECONFIG_PLACEHOLDER.format(cluster=action.cluster_id)
    # the GPUs go in the peering's first ResourceSlice (liqoctl peer --resource, repeatable); the provider's
    # ResourceSlice class decides what it grants
    gpus = [f"--resource={L.GPU_RESOURCE}={action.gpus}"] if action.peer and action.gpus else []
    return ["liqoctl", action.kind, "--remote-kubeconfig", path, *gpus]


def shown_command(action: Peering) -> str:
    """The command an operator runs by hand when the service may not (one line, shell-quoted)."""
    return " ".join(f"'{part}'" if " " in part else part for part in command(action))


@dataclass(frozen=True)
class LiqoctlResult:
    """How a liqoctl run ended."""

    ok: bool
    message: str
    """In words: what ran, its exit status and the last lines it printed."""


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(action: Peering, timeout: float = TIMEOUT_SECONDS) -> LiqoctlResult:
    """Run liqoctl for ``action`` with its uploaded kubeconfig; never raises for liqoctl's own failures."""
    if not action.kubeconfig.strip():
        raise InvalidRequest(f"{action.kind} {action.cluster_id}: upload the remote cluster's kubeconfig first")
    executable = shutil.which("liqoctl")
    if executable is None:
        return LiqoctlResult(False, "liqoctl is not installed in the hub image (not on PATH); install it there, or "
                                    f"run by hand: {shown_command(action)}")
    with tempfile.TemporaryDirectory(prefix="gpu-offload-peer-") as folder:
        remote = Path(folder) / "remote-kubeconfig.yaml"
        fd = os.open(remote, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # secrets: owner only
        with os.fdopen(fd, "w") as handle:
            handle.write(action.kubeconfig)
        argv = command(action, str(remote))
        argv[0] = executable
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return LiqoctlResult(False, f"liqoctl {action.kind} {action.cluster_id} did not finish within "
                                        f"{timeout:g}s and was stopped; check the peering with liqoctl info")
    what = f"liqoctl {action.kind} for cluster {action.cluster_id}"
    if done.returncode == 0:
        return LiqoctlResult(True, f"{what} succeeded. {_tail(done.stdout)}".strip())
    return LiqoctlResult(False, f"{what} failed with exit status {done.returncode}: "
                                f"{_tail(done.stderr or done.stdout) or 'no output'}")
