"""A pytest plugin for the Kubernetes Python client's e2e tests (bench/outside_client.py loads it with ``-p``).

The client's wheel ships e2e tests (``kubernetes/dynamic/test_client.py``, ``test_discovery.py``) that import
``kubernetes.e2e_test.base``, a module of the client's repository the wheel leaves out. This plugin gives the
package ``kubernetes.e2e_test`` before the tests are collected: the repository's own folder when the run has a
checkout (``OUTSIDE_E2E_DIR``), else a ``base`` with the one function the wheel's tests call, configured from
``KUBECONFIG`` as the repository's ``base.get_e2e_configuration`` configures itself when a kubeconfig exists.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import kubernetes
from kubernetes.client import Configuration
from kubernetes.config import kube_config


def get_e2e_configuration() -> Configuration:
    config = Configuration()
    kube_config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=config)
    config.assert_hostname = False
    return config


def _package() -> types.ModuleType:
    folder = os.environ.get("OUTSIDE_E2E_DIR")
    package = types.ModuleType("kubernetes.e2e_test")
    package.__spec__ = importlib.machinery.ModuleSpec("kubernetes.e2e_test", None, is_package=True)
    package.__path__ = [folder] if folder else []
    package.__spec__.submodule_search_locations = package.__path__
    if not folder:
        base = types.ModuleType("kubernetes.e2e_test.base")
        base.get_e2e_configuration = get_e2e_configuration  # type: ignore[attr-defined]
        package.base = base  # type: ignore[attr-defined]
        sys.modules[base.__name__] = base
    return package


sys.modules["kubernetes.e2e_test"] = kubernetes.e2e_test = _package()  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Deselect the tests ``OUTSIDE_DESELECT`` names (``file.py::Class::test``, one a line; the file by its name:
    node ids of files outside the rootdir carry no stable folder)."""
    wanted = set(os.environ.get("OUTSIDE_DESELECT", "").split())
    dropped = [item for item in items if "::".join((item.path.name, *item.nodeid.split("::")[1:])) in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
