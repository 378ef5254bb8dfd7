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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest

from . import leftovers
from .liqo import seed as liqo
from .liqo.origin import RunningOrigin, running_origin
from .server import Plugin

T = TypeVar("T")


def origin_key(crds: Path | Sequence[Path] | None, options: dict[str, Any], addon: Addon | None = None) -> str:
    """One string per distinct origin configuration (CRDs, options, add-on): equal configurations share one origin.
    The donors are not part of it: each module peers its own into the shared origin (:meth:`SharedOrigin.lent`)."""
    folders = [crds] if isinstance(crds, Path | str) else list(crds or ())
    resolved = [str(Path(folder).resolve()) for folder in folders]
    folder: Any = resolved[0] if isinstance(crds, Path | str) else tuple(resolved) if crds else None
    return repr((folder, sorted(options.items()), *((addon.key,) if addon else ())))


def donor_list(donors: int | Sequence[liqo.Donor], gpus: int = 4, gpu_model: str = "A100") -> tuple[liqo.Donor, ...]:
    """The donors ``origin_fixture``'s arguments name: ``donors`` as given, or that many of ``gpus`` ``gpu_model``."""
    return liqo.donors(donors, gpus, gpu_model) if isinstance(donors, int) else tuple(donors)


def pooled_as(key: str) -> Callable[[T], T]:
    """Mark a module's own ``origin`` fixture function (under ``@pytest.fixture``) as serving the pooled origin of
    ``key`` (:func:`origin_key`), so the suite keeps its tests on that origin's xdist worker."""
    def mark(function: T) -> T:
        function.origin_key = key  # type: ignore[attr-defined]
        return function
    return mark


def active_faults(running: RunningOrigin) -> list[str]:
    """The faults injected into ``running`` that still act (an API rule that was removed from the server, or has
    fired its times, does not)."""
    faults = running.faults
    rules = [rule for rule in faults.rules if running.sandbox.api.faults.acting(rule)]
    return ([f"node {name} lost" for name in sorted(faults.lost_nodes)]
            + [f"image {image} missing" for image in sorted(faults.images.missing)]
            + [f"image {image} pulled slowly" for image in sorted(faults.images.pull_times)]
            + [f"API rule on {rule.path}" for rule in rules])


LEFTOVER_GRACE = 60.0
"""Seconds a module's last deletions get to take effect (pods stopping, a slice's virtual node going)."""


class SharedOrigin:
    """A pooled origin, started with no donors, and the state every module using it must leave it in
    (:mod:`.leftovers`); ``addon`` is what :class:`Addon` made for it (Kueue's controller, say).

    A module peers the donors it needs for its scope (:meth:`lent`) and they are unpeered after it, as Liqo peers
    and unpeers at run time (``liqo/peering.py``), so modules with other donors share the origin."""

    def __init__(self, running: RunningOrigin, addon: Any = None) -> None:
        self.running = running
        self.addon = addon
        self.system = leftovers.system_namespaces(running.sandbox.api)
        self.bare = self._settled()
        """The state with no donor peered: what the origin must be again after each module's donors leave."""
        self.expected = self.bare
        self.donors: tuple[liqo.Donor, ...] = ()
        self.holders: list[str] = []

    def state(self) -> dict[str, Any]:
        return leftovers.cluster_state(self.running.sandbox.api, self.system, active_faults(self.running))

    def _settled(self) -> dict[str, Any]:
        """The state once the controllers have done what start-up or a peering gave them (slices granted, nodes
        made)."""
        previous = self.state()
        for _ in range(200):
            time.sleep(0.1)
            current = self.state()
            if current == previous:
                return current
            previous = current
        return previous

    @contextmanager
    def lent(self, donors: Sequence[liqo.Donor], module: str, cleanup: Callable[[], None] | None = None,
             grace: float = LEFTOVER_GRACE) -> Iterator[RunningOrigin]:
        """The origin with ``donors`` peered for ``module``: peered on entry (unless a wider fixture holds the
        same donors), then ``cleanup``, the check that the module left the origin as it found it, and, when no
        one holds them any more, the donors unpeered and the check that the origin is as it was before them."""
        donors = tuple(donors)
        if self.holders and donors != self.donors:
            raise RuntimeError(f"{module} asks for donors {_names(donors)} on an origin that holds {_names(self.donors)} "
                               f"for {self.holders[0]}: a fixture of wider scope keeps its donors peered; make it "
                               "module-scoped, or give the module the same donors")
        if not self.holders:
            stray = self.running.peered()
            if stray:  # left by a module that already failed for it: the next one starts clean
                self.running.unpeer(stray)
            self.running.peer(donors)
            self.donors = donors
            self.expected = self._settled()
        self.holders.append(module)
        found = self._namespaces()
        try:
            yield self.running
        finally:
            clean = False
            try:
                if cleanup is not None:
                    cleanup()
                self.check(module, grace)
                clean = True
            finally:
                try:
                    if not clean:
                        self._sweep(found, cleanup)
                finally:
                    self.holders.remove(module)
                    if not self.holders:
                        self._unpeer(module, check=clean)

    def _namespaces(self) -> set[str]:
        return {ns["metadata"]["name"] for ns in self.running.sandbox.api.store.list(("", "namespaces"))[0]}

    def _sweep(self, found: set[str], cleanup: Callable[[], None] | None) -> None:
        """After a module that failed for what it left (or whose cleanup failed): delete the namespaces it made
        and did not delete, wait until their pods are gone, and run its cleanup again, so the next module on the
        origin starts from what this one found, not from its running pods holding the donors' GPUs."""
        keep = found | self.system | leftovers.tenant_namespaces(self.running.sandbox.api)
        made = sorted(self._namespaces() - keep)
        client = self.running.sandbox.api_client()
        core = kubernetes.client.CoreV1Api(client)
        try:
            for name in made:
                try:
                    core.delete_namespace(name)
                except kubernetes.client.ApiException as error:
                    if error.status != 404:
                        raise
            wait_until(lambda: not set(made) & self._namespaces(), f"the namespaces {made} a failed module left to go",
                       timeout=LEFTOVER_GRACE)
        finally:
            client.close()
        if cleanup is not None:
            cleanup()
        self.expected = self._settled()

    def _unpeer(self, module: str, check: bool = True) -> None:
        """Unpeer the module's donors (those it did not unpeer itself) and fail if the origin is not as it was
        before they came; after a module that already failed for what it left, the state without its donors is
        taken as it is (the next module is judged from there, as after :meth:`check`)."""
        peered = set(self.running.peered())
        try:
            self.running.unpeer([d.cluster_id for d in self.donors if d.cluster_id in peered])
        finally:
            self.donors = ()
            self.expected = self.bare
        if not check:
            self.bare = self.expected = self._settled()
            return
        self.check(f"{module} (its donors unpeered)")
        self.bare = self.expected

    def check(self, module: str, grace: float = LEFTOVER_GRACE) -> None:
        """Fail naming what ``module`` left changed on the origin; later modules then start from that state,
        so only the module that left it fails."""
        lines: list[str] = []

        def same() -> bool:
            lines[:] = leftovers.differences(self.expected, self.state())
            return not lines

        deadline = time.monotonic() + grace
        while not same() and time.monotonic() < deadline:
            time.sleep(0.2)
        if lines:
            self.expected = self.state()
            pytest.fail(f"{module} left the shared origin changed (a test must undo what it changes, in a finally, "
                        "or the module must ask for origin_fixture(..., private=True)):\n  " + "\n  ".join(lines),
                        pytrace=False)


def _names(donors: Sequence[liqo.Donor]) -> str:
    return ", ".join(d.cluster_id for d in donors) or "none"


@dataclass(frozen=True)
class Addon:
    """More of an origin than Liqo: ``make()`` gives the object tests use and the server plugin that installs it
    (``sandbox.kueue.testing``'s Kueue); ``key`` is its configuration, part of the origin's."""

    key: str
    make: Callable[[], tuple[Any, Plugin]]


class OriginPool:
    """Origins started on first use and kept for the session, one per configuration."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._stack = ExitStack()
        self._origins: dict[str, SharedOrigin] = {}

    def shared(self, crds: Path | Sequence[Path] | None, addon: Addon | None = None, **options: Any) -> SharedOrigin:
        """The session's origin of this configuration, started (with no donors) on first use."""
        key = origin_key(crds, options, addon)
        if key not in self._origins:
            made, plugins = addon.make() if addon is not None else (None, None)
            running = self._stack.enter_context(running_origin(
                self._tmp.mktemp("origin"), (), crds=crds, plugins=[plugins] if plugins is not None else (),
                **options))
            self._origins[key] = SharedOrigin(running, made)
        return self._origins[key]

    def close(self) -> None:
        """Stop every origin; none may leave a container process alive."""
        origins = [shared.running for shared in self._origins.values()]
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

    def origin(origin_pool: OriginPool, request: pytest.FixtureRequest) -> Iterator[RunningOrigin]:
        shared = origin_pool.shared(crds, **options)
        with shared.lent(donor_list(donors, gpus, gpu_model), request.node.nodeid) as running:
            yield running

    # The suite's conftest keeps the tests of a configuration on one xdist worker, so it starts once a run.
    origin.origin_key = origin_key(crds, options)  # type: ignore[attr-defined]
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


def install_crds(api_client: Any, folder: Path) -> list[str]:
    """Register every CustomResourceDefinition in ``folder`` through the API, as installing an operator (Kueue,
    say) registers its CRDs; one already registered is left as it is. Returns the names of those it created (a test
    on a shared origin deletes them afterwards)."""
    import yaml

    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    created: list[str] = []
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            extensions.create_custom_resource_definition(crd)
            created.append(crd["metadata"]["name"])
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
    return created


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
