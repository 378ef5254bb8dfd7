"""KubeSpawner's own test suite against ``gpu-offload sandbox`` or the real cluster: passed, failed and errors.

An outside client's suite, unchanged, is the test of whether the sandbox behaves like a cluster: its
hub runs in a pod (``quay.io/jupyterhub/jupyterhub``), its user servers in pods (``jupyterhub-singleuser``),
it execs Python in pods, reads events and logs, and deletes namespaces. The script

1. makes a venv of the suite's own in ``--venv`` (default ``<checkout>/.sandbox-venv``), once:
   ``pip install -e <checkout>[test]`` with releases of the suite's time (``REQUIREMENTS``), and, if the machine has no
   ``configurable-http-proxy`` (which the hub image carries), ``npm install`` of it in the venv;
2. with ``--cluster sandbox`` (the default) starts ``gpu-offload sandbox --donors 1`` (origin nodes with the
   test kubelet; the default image map; Warn field validation, as kube-apiserver) and waits for its
   kubeconfig; with ``--cluster real`` uses the running real cluster (tests/realcluster, ``RC_INDEX``), whose
   nodes pull the suite's images from tests/realcluster/registry.sh's registry;
3. runs ``pytest tests/`` in the checkout with ``KUBECONFIG`` pointing there, and prints the counts and
   each test that did not pass, after the machine line.

The suite is not in CI: CI reaches package registries only, and KubeSpawner's published sdist has no
``tests/``. Given a checkout (e.g. tag 7.1.0 of jupyterhub/kubespawner), run it here as root:

    .venv/bin/python bench/outside_kubespawner.py /path/to/kubespawner [--cluster real] [-- -k test_spawn]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from outside import CLUSTERS, Pytest, exit_on_sigterm, print_setting, report, run_suite

REQUIREMENTS = ("jupyterhub<6", "kubernetes<37", "pytest-asyncio>=0.17,<0.23", "pytest<9")
"""Beside ``-e <checkout>[test]``, releases of the suite's time (7.1.0 was tested with JupyterHub 5 and
kubernetes 3x): its ``ssl_app`` fixture builds a JupyterHub outside an event loop, which JupyterHub 6's HTTP
client refuses; kubernetes 37's ``sanitize_for_serialization`` no longer serializes kubernetes_asyncio's models
by their JSON names (86 of the 88 tests of test_objects.py fail); pytest-asyncio 0.21 (the suite's pin) reaches into pytest
internals that pytest 9 removed."""


def _run(cmd: list[str], **kwargs: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def ensure_venv(checkout: Path, venv: Path) -> Path:
    """The suite's venv, made once; returns the folder of configurable-http-proxy to offer the sandbox."""
    marker = venv / ".suite-installed"
    wanted = "\n".join((str(checkout), *REQUIREMENTS))
    if not (marker.is_file() and marker.read_text() == wanted):
        _run([sys.executable, "-m", "venv", "--clear", str(venv)])
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", f"{checkout}[test]", *REQUIREMENTS])
        marker.write_text(wanted)
    node_bin = venv / "node" / "node_modules" / ".bin"
    if shutil.which("configurable-http-proxy") is None and not (node_bin / "configurable-http-proxy").exists():
        if shutil.which("npm") is None:
            raise SystemExit("outside_kubespawner: the hub pod needs configurable-http-proxy and there is no npm "
                             "to install it; install node and npm (or configurable-http-proxy) and rerun")
        _run(["npm", "install", "--silent", "--prefix", str(venv / "node"), "configurable-http-proxy"])
    return node_bin


def _version(python: Path, module: str) -> str:
    out = subprocess.run([str(python), "-c", f"import {module}; print({module}.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def _commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "not a git checkout"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a KubeSpawner source tree with tests/")
    parser.add_argument("--venv", type=Path, default=None, help="the suite's venv (default <checkout>/.sandbox-venv)")
    parser.add_argument("--cluster", choices=CLUSTERS, default="sandbox", help="where the suite runs (default sandbox)")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (e.g. -k NAME)")
    args = parser.parse_args()
    exit_on_sigterm()
    checkout = args.checkout.resolve()
    if not (checkout / "tests" / "conftest.py").is_file():
        raise SystemExit(f"outside_kubespawner: {checkout} has no tests/conftest.py; give a KubeSpawner git "
                         "checkout (its published sdist has no tests)")
    if os.geteuid() != 0 and args.cluster == "sandbox":
        print("outside_kubespawner: not root, so the sandbox's pods share the host's network: two user servers "
              "on port 8888 collide and more tests fail than the ones docs/sandbox.md explains", flush=True)
    venv = (args.venv or checkout / ".sandbox-venv").resolve()
    tool_dir = ensure_venv(checkout, venv)
    python = venv / "bin" / "python"

    def command(workdir: Path, junit: Path, kubeconfig: Path) -> Pytest:
        return Pytest([str(python), "-m", "pytest", "tests/", "-p", "no:cacheprovider", "-rfEs",
                       f"--junitxml={junit}", *args.pytest_args], checkout, dict(os.environ, KUBECONFIG=str(kubeconfig)))

    result = run_suite("outside_kubespawner", args.cluster, command, "--tool-dir", str(tool_dir))
    print_setting(f"kubespawner {_version(python, 'kubespawner')} ({_commit(checkout)}), jupyterhub "
                  f"{_version(python, 'jupyterhub')}", args.cluster, result)
    return report("KubeSpawner tests/", result.total, result.bad)


if __name__ == "__main__":
    sys.exit(main())
