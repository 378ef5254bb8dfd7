"""kubectl for the tests that drive a cluster through it, as an admin would: ``GPU_OFFLOAD_KUBECTL`` (a command line;
tests/realcluster/run.sh sets it to the kubectl of the cluster binary it built, ``cluster kubectl``), else the
kubectl on PATH. These tests are marked ``real_cluster`` (the stage that has that kubectl runs them, on the sandbox
too) and skip elsewhere without one, saying how to get one."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

ENV = "GPU_OFFLOAD_KUBECTL"
T = TypeVar("T")


def command() -> list[str] | None:
    """The kubectl command line to run, None when there is none."""
    if os.environ.get(ENV):
        return shlex.split(os.environ[ENV])
    found = shutil.which("kubectl")
    return [found] if found else None


MARKS = [pytest.mark.real_cluster,
         pytest.mark.skipif(command() is None, reason=f"no kubectl: put one on PATH or name one in {ENV} "
                            "(tests/realcluster/run.sh sets it to its built cluster binary's kubectl)")]
"""The marks of a module whose tests run kubectl (``pytestmark``): in the real-cluster stage, skipped without a
kubectl elsewhere."""


def needed(test: T) -> T:
    """The marks of :data:`MARKS` on one test."""
    for mark in MARKS:
        test = mark(test)
    return test


def run(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``kubectl --kubeconfig KUBECONFIG ARGS``; with ``check``, a failure fails the test with kubectl's stderr."""
    kubectl = command()
    assert kubectl is not None, f"no kubectl ({ENV} or PATH)"
    result = subprocess.run([*kubectl, "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True,
                            text=True, timeout=timeout, check=False)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
    return result


@contextlib.contextmanager
def start(kubeconfig: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``kubectl ARGS`` left running for the block (``kubectl wait`` while something else happens; communicate()
    to see how it ended); killed after the block if it still runs."""
    kubectl = command()
    assert kubectl is not None, f"no kubectl ({ENV} or PATH)"
    with subprocess.Popen([*kubectl, "--kubeconfig", str(kubeconfig), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
