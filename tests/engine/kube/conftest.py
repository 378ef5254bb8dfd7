"""Fixtures for the kubernetes backend: an origin with two Liqo donors (sandbox), the real official client,
a fresh namespace and a backend (or a real IPython shell with the magic) per test, and a check that every test
leaves no pod or Secret behind."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import kubernetes
import pytest
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.specs import namespace_offloading, runner_selector
from gpu_offload.magics.magic import GpuOffloadMagics
from gpu_offload.sandbox.fixtures import OriginPool, core, custom, namespace, pooled_as, wait_until
from gpu_offload.sandbox.kueue.pooled import kueue_origin_key, pooled_kueue_origin
from gpu_offload.sandbox.objectstore import s3_server
from IPython.core.interactiveshell import InteractiveShell

from gpu_offload.cli import main
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings

from ...origins import (
    EVIL_IMAGE,
    IMAGE_MAP,
    MISMATCH_IMAGE,
    OTHER_PYTHON,
    PEERED,
    SHARED,
    TWO_MODELS,
    KueueConfig,
)
from ...realcluster.realorigin import KUBECONFIG, RealCluster, RealOrigin, clusters, node_lost, seeded_origin
from ...sandbox.kueue_setup import workloads

STOCK_IMAGE = "python:3.11-slim"
PROJECT_IMAGE = "gpu-offload/notebook:test"
BUCKET = "offload-test"
DONORS = TWO_MODELS
# One origin for all kube test modules, shared with tests/liqo_peering and the panel's, its donors peered for each
# module (a module with other donors peers its own): every test leaves it as it found it (tests/origins.py)
origin = PEERED.fixture()
# core, custom: official clients of the module's origin; namespace: fresh and not offloaded (the backend offloads it)
__all__ = ["EVIL_IMAGE", "IMAGE_MAP", "MISMATCH_IMAGE", "OTHER_PYTHON", "core", "custom", "namespace", "origin"]


def origin_on_each_cluster() -> Any:
    """The ``origin`` of a module whose tests run on the sandbox and on the real cluster (``[sandbox]`` and
    ``[real]``, tests/realcluster): the shared sandbox origin above, or the real cluster seeded with the same
    donors. A module takes it as ``origin = origin_on_each_cluster()``."""

    @pytest.fixture(scope="module", params=clusters(), name="origin")
    def either(request: pytest.FixtureRequest, origin: Any) -> Iterator[Any]:
        if request.param == "real":
            with seeded_origin(DONORS, SHARED / "liqo-crds") as real:
                yield real
            return
        yield origin

    return either


def api_on_each_cluster() -> Any:
    """The ``origin`` of a module that asks only the API server (its own namespaces and objects, no pod on a donor)
    on both clusters: the shared sandbox origin, or the real cluster as up.sh left it, with nothing seeded (which
    takes seconds there). A module takes it as ``origin = api_on_each_cluster()``."""

    @pytest.fixture(scope="module", params=clusters(), name="origin")
    def either(request: pytest.FixtureRequest, origin: Any) -> Any:
        return RealOrigin(RealCluster(KUBECONFIG)) if request.param == "real" else origin

    return either


def kueue_origin_on_each_cluster(config: KueueConfig, real_nodes: int | None = None) -> Any:
    """The ``origin`` of a queued module whose tests run on the sandbox and on the real cluster: the real cluster
    with ``config``'s donors seeded (the first ``real_nodes`` on the real kubelets' nodes, see ``seeded_origin``),
    or the session's sandbox origin with Kueue of ``config``, shared by every module that names the same
    configuration (tests/origins.py). After a module its queue pool is deleted and the origin checked. A module
    takes it as ``origin = kueue_origin_on_each_cluster(CONFIG)``."""
    options = config.pool_options()

    @pytest.fixture(scope="module", params=clusters(), name="origin")
    @pooled_as(kueue_origin_key(**options))
    def either(request: pytest.FixtureRequest, origin_pool: OriginPool) -> Iterator[Any]:
        if request.param == "real":  # real Kubernetes and Kueue (tests/realcluster), Liqo's objects seeded
            with seeded_origin(config.donors, SHARED / "liqo-crds", real_nodes=real_nodes) as real:
                yield real
            return
        with pooled_kueue_origin(origin_pool, request.node.nodeid, **options) as (running, _):
            yield running

    return either


def leftovers(core: Any, namespace: str, user: str = "alice@example.org") -> list[str]:
    """Names of the pods and Secrets the project created for ``user`` that still exist."""
    selector = runner_selector(user)
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    secrets = core.list_namespaced_secret(namespace, label_selector=selector).items
    return [f"pod/{p.metadata.name}" for p in pods] + [f"secret/{s.metadata.name}" for s in secrets]


def sandbox_faults(origin: Any) -> Any:
    """The origin's fault injection (requests the sandbox's API server holds or refuses); a test that needs it is
    skipped on the real cluster, whose API server has no such switch."""
    faults = getattr(origin, "faults", None)
    if faults is None:
        pytest.skip("injects API faults, which only the sandbox's API server takes")
    return faults


@contextlib.contextmanager
def donor_lost(origin: Any, node: str, grace: float) -> Iterator[None]:
    """The node of a donor stops answering for the block, and answers again after it: on the real cluster its
    kubelet is killed (its containers run on; the node controller's own grace, 50 s, applies), on the sandbox the
    ``node-not-ready`` fault does the same with ``grace`` seconds of node-monitor grace."""
    faults = getattr(origin, "faults", None)
    if faults is None:
        with node_lost(node):
            yield
        return
    origin.call(faults.node_not_ready(node, grace=grace))
    try:
        yield
    finally:
        faults.node_ready(node)


def settings(namespace: str, **changes: Any) -> KubeSettings:
    """Settings of a backend for user alice in ``namespace``, with a kernel id unique to the test."""
    base = KubeSettings(namespace=namespace, image=STOCK_IMAGE, user="alice@example.org",
                        kernel=f"k-{uuid.uuid4().hex[:8]}", watch_seconds=5)
    return KubeSettings(**{**base.__dict__, **changes})


def queued_user_namespace(core: Any, custom: Any) -> str:
    """A namespace as the hub's spawner makes one with queueing on: labelled for the ClusterQueue, offloaded to
    the donors, with its LocalQueue made by the project's own ``gpu-offload queues sync`` (which needs
    KUBECONFIG set to the origin's)."""
    name = f"jhub-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", name, "namespaceoffloadings", {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}})
    assert main(["queues", "sync", "--namespace", name]) == 0
    return name


@pytest.fixture()
def user_ns(origin: Any, core: Any, custom: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user namespace with its LocalQueue, as the hub makes one, on the module's ``origin``; afterwards its pods
    and Workloads are gone."""
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    namespace = queued_user_namespace(core, custom)
    yield namespace
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "no pod left", timeout=60)
    wait_until(lambda: not workloads(custom, namespace), "no Workload left", timeout=60)
    core.delete_namespace(namespace)


@pytest.fixture()
def offloaded_everywhere(api_client: Any, namespace: str) -> str:
    """The namespace offloaded as the hub's spawner offloads a user namespace: to every peered cluster, with the
    project's NamespaceOffloading builder (so the strategy is the project's)."""
    g = L.NAMESPACE_OFFLOADING
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        g.group, g.version, namespace, g.plural, namespace_offloading(namespace))
    return namespace


@pytest.fixture()
def kube(api_client: Any, namespace: str, core: Any) -> Iterator[KubernetesBackend]:
    """A kubernetes backend on the sandbox; after the test, nothing of alice's is left in the namespace."""
    backend = KubernetesBackend(settings(namespace), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)


def backend_with_neighbours(api_client: Any, namespace: str, core: Any, origin: Any) -> Iterator[KubernetesBackend]:
    """A backend for a test that adds a neighbour's pods and fault rules to its own origin (``yield from`` it
    in the module's ``kube`` fixture): afterwards the rules are gone, every pod of the namespace is deleted
    and nothing of alice's is left."""
    backend = KubernetesBackend(settings(namespace), api_client)
    yield backend
    backend.close()
    origin.faults.clear()
    for pod in core.list_namespaced_pod(namespace).items:  # the neighbour's
        with contextlib.suppress(kubernetes.client.ApiException):  # gone since listed is fine
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "no pod left behind", timeout=60)
    assert leftovers(core, namespace) == []


def neighbour_takes_first(origin: Any, core: Any, namespace: str, create: str, node: str, gpus: int) -> threading.Thread:
    """While this kernel's create (a POST to the API path ``create``, a regex) is held at the API server, after
    placement chose ``node``, a neighbour's pod takes ``gpus`` of that node's GPUs; only then is the create
    served, so the scheduler finds less room than placement saw, however loaded the machine is. Join the
    thread after the run; the ``kube`` fixture of :func:`backend_with_neighbours` deletes the neighbour."""
    rule = origin.faults.api_hold(create, methods=("POST",))

    def take() -> None:
        try:
            wait_until(lambda: origin.faults.api.faults.fired(rule) >= 1, "this kernel's create held")
            core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "neighbour"},
                "spec": {"nodeName": node, "containers": [{
                    "name": "c", "image": STOCK_IMAGE, "command": ["python3", "-c", "import time; time.sleep(600)"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                    "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                     "effect": "NoExecute"}]}})
        finally:
            origin.faults.release(rule)

    thread = threading.Thread(target=take)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def s3_endpoint(origin: Any) -> Iterator[str]:
    """A moto S3 server for the module, where both the kernel and the pods reach it."""
    with s3_server(origin.host_address) as endpoint:
        yield endpoint


@pytest.fixture()
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A client of the moto server (credentials only in the kernel's environment) with an empty bucket."""
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture()
def shell(origin: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real IPython shell whose magic builds its backend from the environment, like a user's server."""
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.setenv("GPU_OFFLOAD_NAMESPACE", namespace)
    monkeypatch.setenv("GPU_OFFLOAD_IMAGE", STOCK_IMAGE)
    monkeypatch.setenv("GPU_OFFLOAD_KERNEL_ID", f"k-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("JUPYTERHUB_USER", "alice@example.org")
    monkeypatch.delenv("GPU_OFFLOAD_BACKEND", raising=False)
    ipython = InteractiveShell.instance()
    ipython.reset()
    magics = GpuOffloadMagics(ipython)
    ipython.register_magics(magics)
    yield ipython
    magics.close()
