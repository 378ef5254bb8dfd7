"""The Kubernetes Python client's own e2e tests against ``gpu-offload sandbox`` or the real cluster.

An outside client's suite, unchanged, as a test of whether a cluster behaves like Kubernetes: it creates and
reads pods, exec's and attaches to them, port-forwards, watches, applies YAML of every kind and uses the dynamic
client's discovery. Two sources, neither copied into this repository:

- the tests the client's wheel ships (``kubernetes/dynamic/test_client.py`` and ``test_discovery.py``, from the
  ``kubernetes`` release pip installed in this venv), always;
- with ``--checkout PATH``, the repository's ``kubernetes/e2e_test/`` of the same release (its published sdist
  and wheel leave that folder out): a git checkout of kubernetes-client/python at the tag ``v<version>``.

The wheel's tests import ``kubernetes.e2e_test.base``, which the wheel leaves out; ``outside_client_plugin.py``
provides it (from ``KUBECONFIG``) or maps the checkout's folder. Tests outside the scope of any current
cluster are deselected and listed (``OUT_OF_SCOPE``). Run as root (the sandbox's pods get their own network):

    .venv/bin/python bench/outside_client.py [--cluster real] [--checkout /path/to/python-client] [-- -k pod]
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version
from pathlib import Path

from outside import CLUSTERS, Pytest, exit_on_sigterm, print_setting, report, run_suite

TEST_TIMEOUT = 120
"""Seconds per test (pytest-timeout, which the project's test extra installs)."""
WHEEL_TESTS = ("kubernetes.dynamic.test_client", "kubernetes.dynamic.test_discovery")
OUT_OF_SCOPE = {
    "test_client.py::TestDynamicClient::test_cluster_custom_resources":
        "creates a CRD through apiextensions.k8s.io/v1beta1, which Kubernetes removed in 1.22",
    "test_client.py::TestDynamicClient::test_namespaced_custom_resources":
        "creates a CRD through apiextensions.k8s.io/v1beta1, which Kubernetes removed in 1.22",
    "test_client.py::TestDynamicClient::test_async_namespaced_custom_resources":
        "creates a CRD through apiextensions.k8s.io/v1beta1, which Kubernetes removed in 1.22",
    "test_discovery.py::TestDiscoverer::test_cache_decoder_resource_and_subresource":
        "compares two Resource objects with ==, and this release's Resource has no __eq__ (fails on the real "
        "cluster: two decodings of one discovery document are different objects)",
}
"""Tests that fail on every Kubernetes the client supports, by file name, class and test (the wheel's tests are
``kubernetes/dynamic/``'s)."""


def _site_packages() -> Path:
    import kubernetes

    return Path(kubernetes.__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", choices=CLUSTERS, default="sandbox", help="where the suite runs (default sandbox)")
    parser.add_argument("--checkout", type=Path, default=None,
                        help="a kubernetes-client/python checkout at this client's tag: also run kubernetes/e2e_test/")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (e.g. -k NAME)")
    args = parser.parse_args()
    exit_on_sigterm()
    client = version("kubernetes")
    site = _site_packages()
    targets = [str(site / Path(*name.split("."))) + ".py" for name in WHEEL_TESTS]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(Path(__file__).parent),
                                                                      os.environ.get("PYTHONPATH")))))
    env["OUTSIDE_DESELECT"] = "\n".join(OUT_OF_SCOPE)  # outside_client_plugin.py deselects them
    if args.checkout:
        e2e = (args.checkout / "kubernetes" / "e2e_test").resolve()
        if not (e2e / "base.py").is_file():
            raise SystemExit(f"outside_client: {e2e} has no base.py; give a kubernetes-client/python checkout "
                             f"at tag v{client}")
        env["OUTSIDE_E2E_DIR"] = str(e2e)
        targets.append(str(e2e))

    def command(workdir: Path, junit: Path, kubeconfig: Path) -> Pytest:
        # the suite's own settings (not those of a checkout around the venv), and a time limit per test: the
        # client's tests wait for a pod's phase without one, for ever where its image cannot run
        ini = workdir / "pytest.ini"
        ini.write_text(f"[pytest]\ntimeout = {TEST_TIMEOUT}\n")
        # the repository's tests import their helpers as kubernetes.e2e_test.* (importlib mode: no rootdir on
        # sys.path, so `kubernetes` stays the wheel's) and open their YAML relative to the checkout
        return Pytest([sys.executable, "-m", "pytest", *targets, "-p", "outside_client_plugin",
                       "-p", "no:cacheprovider", "-c", str(ini), "--rootdir", str(workdir),
                       "--import-mode=importlib", "-rfEs", f"--junitxml={junit}", *args.pytest_args],
                      args.checkout or workdir, dict(env, KUBECONFIG=str(kubeconfig)))

    result = run_suite("outside_client", args.cluster, command)
    print_setting(f"kubernetes client {client} (wheel"
                  f"{' + e2e_test of ' + str(args.checkout) if args.checkout else ''})", args.cluster, result)
    for test, why in OUT_OF_SCOPE.items():
        print(f"  out of scope (deselected): {test}: {why}")
    return report("Kubernetes Python client e2e", result.total, result.bad)


if __name__ == "__main__":
    sys.exit(main())
