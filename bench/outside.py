"""What the outside suites' runners share (bench/outside_kubespawner.py, bench/outside_client.py): the cluster
a suite runs against, the sandbox or the real cluster, and the counts read from pytest's JUnit report.

``--cluster sandbox`` starts ``gpu-offload sandbox --donors 1`` for the run; ``--cluster real`` uses the
running real cluster of tests/realcluster (``RC_INDEX``, default 0; its admin kubeconfig) after
tests/realcluster/registry.sh has put the suites' images in a registry its nodes pull from.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from harness import machine_line, sandbox_process  # bench/harness.py: the script's folder is on sys.path

KUBECONFIG_WAIT = 180.0
CLUSTERS = ("sandbox", "real")


@dataclass(frozen=True)
class Outcome:
    """One test that did not pass."""

    test: str
    kind: str
    """failure, error or skipped"""
    message: str


@dataclass(frozen=True)
class RealCluster:
    """Where tests/realcluster's cluster of ``RC_INDEX`` keeps its state (env.sh's values)."""

    index: int

    @property
    def state(self) -> Path:
        default = "/var/tmp/gpu-offload-realcluster" + (f"-{self.index}" if self.index else "")
        return Path(os.environ.get("RC_STATE", default))

    @property
    def registry(self) -> str:
        return f"10.219.{self.index}.1:{26000 + 1000 * self.index + 500}"  # env.sh's RC_HOST_IP, RC_REGISTRY_PORT


def exit_on_sigterm() -> None:
    """SIGTERM ends the runner through its ``finally`` blocks, so the sandbox it started stops with it."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def real_cluster() -> RealCluster:
    """The running real cluster, or an error naming the command that starts it and serves the images."""
    cluster = RealCluster(int(os.environ.get("RC_INDEX", "0")))
    kubeconfig = cluster.state / "admin.kubeconfig"
    if not kubeconfig.is_file():
        raise SystemExit(f"outside suites: no real cluster ({kubeconfig} is missing); start it with "
                         "`bash tests/realcluster/up.sh` (RC_INDEX picks the cluster)")
    try:
        urllib.request.urlopen(f"http://{cluster.registry}/v2/", timeout=5).close()
    except OSError as exc:
        raise SystemExit(f"outside suites: the real cluster's nodes cannot pull the suites' images ({exc}); "
                         "run `bash tests/realcluster/registry.sh` first") from None
    return cluster


@contextlib.contextmanager
def cluster_kubeconfig(cluster: str, workdir: Path, *sandbox_args: str) -> Iterator[Path]:
    """The kubeconfig of the cluster the suite runs against, for the run's duration."""
    if cluster == "real":
        yield real_cluster().state / "admin.kubeconfig"
        return
    with sandbox_process(workdir, "--donors", "1", "--state-dir", str(workdir / "state"), *sandbox_args,
                         wait=KUBECONFIG_WAIT) as kubeconfig:
        yield kubeconfig


def outcomes(junit: Path) -> tuple[int, list[Outcome]]:
    """Number of tests and the ones that did not pass, from pytest's JUnit XML."""
    root = ET.parse(junit).getroot()
    total, bad = 0, []
    for case in root.iter("testcase"):
        total += 1
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                message = node.get("message") or ""
                bad.append(Outcome(f"{case.get('classname')}::{case.get('name')}", kind,
                                   message.splitlines()[0][:160] if message else ""))
    return total, bad


def report(title: str, total: int, bad: list[Outcome]) -> int:
    """Print the counts and every test that did not pass; the exit status (1 on a failure or error)."""
    counts = {kind: sum(1 for o in bad if o.kind == kind) for kind in ("failure", "error", "skipped")}
    print(f"{title}: {total} tests, {total - sum(counts.values())} passed, {counts['failure']} failed, "
          f"{counts['error']} errors, {counts['skipped']} skipped")
    for o in bad:
        print(f"  {o.kind}: {o.test}: {o.message}")
    return 0 if not counts["failure"] and not counts["error"] else 1


@dataclass(frozen=True)
class Pytest:
    """How to run a suite once the cluster is up: its command line, folder and environment."""

    argv: Sequence[str]
    cwd: Path
    env: Mapping[str, str]


@dataclass(frozen=True)
class SuiteResult:
    """What one run of a suite gave: how many tests, the ones that did not pass, and how long it took."""

    total: int
    bad: list[Outcome]
    elapsed: float


def run_suite(runner: str, cluster: str, command: Callable[[Path, Path, Path], Pytest],
              *sandbox_args: str) -> SuiteResult:
    """Run a suite's pytest against ``cluster`` in a temporary folder and read its JUnit report.
    ``command(workdir, junit, kubeconfig)`` says how; ``runner`` names the script in its error."""
    with tempfile.TemporaryDirectory(prefix=f"{runner}-") as tmp:
        workdir = Path(tmp)
        junit = workdir / "junit.xml"
        start = time.monotonic()
        with cluster_kubeconfig(cluster, workdir, *sandbox_args) as kubeconfig:
            suite = command(workdir, junit, kubeconfig)
            subprocess.run(list(suite.argv), cwd=suite.cwd, env=dict(suite.env))
        elapsed = time.monotonic() - start
        if not junit.exists():
            raise SystemExit(f"{runner}: pytest wrote no report; see its output above")
        total, bad = outcomes(junit)
    return SuiteResult(total, bad, elapsed)


def print_setting(what: str, cluster: str, result: SuiteResult) -> None:
    """The machine and date lines above a suite's counts: what ran (``what``), where, and for how long."""
    print()
    print(machine_line())
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {what}, cluster {cluster}, "
          f"run time {result.elapsed:.0f} s")
