"""pytest fixtures for an origin cluster with Liqo donors (imported by tests only; needs pytest).

One line in a test module or conftest gives a module-scoped origin with two donors of 4 A100 each::

    origin = origin_fixture(LIQO_CRDS)            # LIQO_CRDS: ../shared/liqo-crds resolved from the repo

Tests then take ``origin`` (a :class:`~gpu_offload.sandbox.liqo.origin.RunningOrigin`). On teardown the
fixture asserts that no container process started by the sandbox is still alive. Import ``core``,
``custom``, ``namespace`` and ``offloaded_namespace`` from here too for official clients and fresh
namespaces (they use whatever ``origin`` fixture the importing module defines).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest

from .liqo.origin import RunningOrigin, running_origin

T = TypeVar("T")


def origin_fixture(crds: Path | None = None, donors: int = 2, gpus: int = 4, gpu_model: str = "A100",
                   scope: Any = "module", **options: Any) -> Any:
    """A pytest fixture serving an origin with ``donors`` donors for the scope's duration."""

    @pytest.fixture(scope=scope)
    def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningOrigin]:
        with running_origin(tmp_path_factory.mktemp("origin"), donors, gpus, gpu_model, crds=crds,
                            **options) as running:
            yield running
        leftover = running.live_processes()
        assert not leftover, f"sandbox container processes still alive after shutdown: {leftover}"

    return origin


def stop_process(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM a server a test started, SIGKILL it after ``grace`` seconds, and reap it."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until(check: Callable[[], T | None], what: str, timeout: float = 60.0, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds.

    The timeout only bounds a hang: no test asserts on how long anything took.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last value: {last!r})")


def install_crds(api_client: Any, folder: Path) -> None:
    """Register every CustomResourceDefinition in ``folder`` through the API, as installing an operator (Kueue,
    say) registers its CRDs; one already registered is left as it is."""
    import yaml

    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    for path in sorted(folder.glob("*.yaml")):
        try:
            extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise


@pytest.fixture(scope="module")
def core(origin: RunningOrigin) -> Iterator[Any]:
    """``CoreV1Api`` of the official client, configured from the origin's kubeconfig file."""
    client = origin.sandbox.api_client()
    yield kubernetes.client.CoreV1Api(client)
    client.close()


@pytest.fixture(scope="module")
def custom(origin: RunningOrigin) -> Iterator[Any]:
    """``CustomObjectsApi`` of the official client, for the Liqo kinds."""
    client = origin.sandbox.api_client()
    yield kubernetes.client.CustomObjectsApi(client)
    client.close()


@pytest.fixture()
def namespace(core: Any) -> Iterator[str]:
    """A fresh namespace, not offloaded, deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture()
def offloaded_namespace(namespace: str, custom: Any) -> str:
    """A fresh namespace with a NamespaceOffloading (LocalAndRemote, every donor)."""
    custom.create_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings",
        {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
         "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "LocalAndRemote"}})
    return namespace
