"""pytest fixtures for an origin cluster with Liqo donors (imported by tests only; needs pytest).

One line in a test module or conftest gives an origin with two donors of 4 A100 each::

    origin = origin_fixture(LIQO_CRDS)            # LIQO_CRDS: ../shared/liqo-crds resolved from the repo

Tests then take ``origin`` (a :class:`~gpu_offload.sandbox.liqo.origin.RunningOrigin`). Origins come from
:func:`origin_pool`, a session-scoped fixture the root conftest imports: every module that asks for the same
configuration (CRDs, donors, options) gets the same origin, started once per test session (per xdist
worker), so its tests must leave it as they found it (fresh namespaces, faults cleared). At the end of the
session the pool asserts that no container process started by any origin is still alive. The root conftest
also offers ``api_client`` from here (a module-scoped official client of whatever ``origin`` the test's module or
conftest defines); import ``core``, ``custom``, ``namespace`` and ``offloaded_namespace`` from here too for
official clients and fresh namespaces.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest

from .liqo import seed as liqo
from .liqo.origin import RunningOrigin, running_origin

T = TypeVar("T")


def origin_key(crds: Path | None, donors: int | Sequence[liqo.Donor], gpus: int, gpu_model: str,
               options: dict[str, Any]) -> str:
    """One string per distinct origin configuration: equal configurations share one origin."""
    donor_list = liqo.donors(donors, gpus, gpu_model) if isinstance(donors, int) else tuple(donors)
    folder = str(Path(crds).resolve()) if crds is not None else None
    return repr((folder, donor_list, sorted(options.items())))


class OriginPool:
    """Origins started on first use and kept for the session, one per configuration."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._stack = ExitStack()
        self._origins: dict[str, RunningOrigin] = {}

    def get(self, crds: Path | None, donors: int | Sequence[liqo.Donor], gpus: int, gpu_model: str,
            **options: Any) -> RunningOrigin:
        key = origin_key(crds, donors, gpus, gpu_model, options)
        if key not in self._origins:
            self._origins[key] = self._stack.enter_context(
                running_origin(self._tmp.mktemp("origin"), donors, gpus, gpu_model, crds=crds, **options))
        return self._origins[key]

    def close(self) -> None:
        """Stop every origin; none may leave a container process alive."""
        origins = list(self._origins.values())
        self._stack.close()
        leftover = [pid for running in origins for pid in running.live_processes()]
        assert not leftover, f"sandbox container processes still alive after shutdown: {leftover}"


@pytest.fixture(scope="session")
def origin_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OriginPool]:
    """The session's origins by configuration (import it into the root conftest)."""
    pool = OriginPool(tmp_path_factory)
    yield pool
    pool.close()


def origin_fixture(crds: Path | None = None, donors: int | Sequence[liqo.Donor] = 2, gpus: int = 4,
                   gpu_model: str = "A100", scope: Any = "module", private: bool = False, **options: Any) -> Any:
    """A pytest fixture giving the session's origin of this configuration (``donors`` donors), from
    :func:`origin_pool`; ``scope`` only says how long a module holds on to it. ``private``: an origin of the
    module's own for the scope, for tests that leave cluster-wide changes other modules must not see."""
    if private:
        @pytest.fixture(scope=scope)
        def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningOrigin]:
            with running_origin(tmp_path_factory.mktemp("origin"), donors, gpus, gpu_model, crds=crds,
                                **options) as running:
                yield running
            leftover = running.live_processes()
            assert not leftover, f"sandbox container processes still alive after shutdown: {leftover}"

        return own

    def origin(origin_pool: OriginPool) -> RunningOrigin:
        return origin_pool.get(crds, donors, gpus, gpu_model, **options)

    # The suite's conftest keeps the tests of one configuration on one xdist worker, so it starts once a run.
    origin.origin_key = origin_key(crds, donors, gpus, gpu_model, options)  # type: ignore[attr-defined]
    return pytest.fixture(scope=scope)(origin)


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
    custom = kubernetes.client.CustomObjectsApi(api_client)
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            extensions.create_custom_resource_definition(crd)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
        # a real API server serves a new CRD's resource only once it is Established (404 until then)
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))

        def served(group: str = spec["group"], version: str = version, plural: str = spec["names"]["plural"]) -> bool:
            try:
                custom.list_cluster_custom_object(group, version, plural, limit=1)
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise
                return False
            return True
        wait_until(served, f"the {crd['metadata']['name']} CRD served", timeout=60, every=0.2)


@pytest.fixture(scope="module")  # module: a module that brings its own origin gets a client of it
def api_client(origin: RunningOrigin) -> Iterator[Any]:
    """An official-client ``ApiClient`` configured from the origin's kubeconfig file, as a user's would be."""
    client = origin.sandbox.api_client()
    yield client
    client.close()


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
