"""The Liqo pair of ``liqo.sh``: an origin and a donor peered by real Liqo, as handles for the tests.

Collected only with ``GPU_OFFLOAD_REAL_LIQO=1`` (``liqo.sh test`` sets it); the main suite and the real-cluster
stage never see these tests. Each cluster is a state directory of ``env.sh`` (index 1 the origin, 2 the donor).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until

ENABLED = os.environ.get("GPU_OFFLOAD_REAL_LIQO") == "1"
ORIGIN_STATE = Path(os.environ.get("LIQO_ORIGIN_STATE", "/var/tmp/gpu-offload-realcluster-1"))
DONOR_STATE = Path(os.environ.get("LIQO_DONOR_STATE", "/var/tmp/gpu-offload-realcluster-2"))
DONOR_ID = "donor"
ORIGIN_ID = "origin"
IMAGE = "docker.io/library/python:3.11-slim"  # lib.sh imports Debian's Python under the stock name
T = TypeVar("T")


@dataclass(frozen=True)
class Cluster:
    """One cluster of the pair: its admin client's APIs."""

    name: str
    kubeconfig: Path

    def client(self) -> Any:
        if not self.kubeconfig.is_file():
            pytest.fail(f"no {self.name} cluster: {self.kubeconfig} is missing; start the pair with "
                        "tests/realcluster/liqo.sh up")
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))


@dataclass(frozen=True)
class Pair:
    origin: Any
    donor: Any

    def core(self, which: str) -> Any:
        return kubernetes.client.CoreV1Api(getattr(self, which))

    def custom(self, which: str) -> Any:
        return kubernetes.client.CustomObjectsApi(getattr(self, which))


@contextlib.contextmanager
def pair() -> Iterator[Pair]:
    with Cluster("origin", ORIGIN_STATE / "admin.kubeconfig").client() as origin, \
            Cluster("donor", DONOR_STATE / "admin.kubeconfig").client() as donor:
        yield Pair(origin, donor)


def wait(check: Callable[[], T | None], what: str, timeout: float = 120.0) -> T:
    """:func:`wait_until` with the pair's longer default and a slower poll (two real clusters answer slower)."""
    return wait_until(check, what, timeout, every=0.5)


def virtual_node(p: Pair) -> dict[str, Any]:
    """The donor's virtual node on the origin, as Liqo made it."""
    nodes = p.core("origin").list_node(label_selector="liqo.io/type=virtual-node").items
    assert len(nodes) == 1, f"expected the donor's one virtual node, found {[n.metadata.name for n in nodes]}"
    node: dict[str, Any] = p.origin.sanitize_for_serialization(nodes[0])
    return node


def offloading_spec(strategy: str) -> dict[str, Any]:
    """The NamespaceOffloading spec of :func:`offloaded_namespace`: the donor only, with ``strategy``."""
    return {"namespaceMappingStrategy": "DefaultName", "podOffloadingStrategy": strategy,
            "clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": [DONOR_ID]}]}]}}


@contextlib.contextmanager
def plain_namespace(p: Pair) -> Iterator[str]:
    """A new origin namespace that is not offloaded; deleted afterwards."""
    name = f"gpuo-plain-{uuid.uuid4().hex[:6]}"
    p.core("origin").create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(kubernetes.client.ApiException):
            p.core("origin").delete_namespace(name, grace_period_seconds=0)


@contextlib.contextmanager
def offloaded_namespace(p: Pair, strategy: str = "Remote") -> Iterator[tuple[str, str]]:
    """A new origin namespace offloaded to the donor with ``strategy``: (origin name, its twin on the donor).
    Deleted afterwards on the origin (Liqo removes the twin)."""
    name = f"gpuo-liqo-{uuid.uuid4().hex[:6]}"
    core = p.core("origin")
    core.create_namespace({"metadata": {"name": name}})
    try:
        p.custom("origin").create_namespaced_custom_object(
            "offloading.liqo.io", "v1beta1", name, "namespaceoffloadings",
            {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
             "metadata": {"name": "offloading", "namespace": name}, "spec": offloading_spec(strategy)})

        def remote() -> str | None:
            obj = p.custom("origin").get_namespaced_custom_object(
                "offloading.liqo.io", "v1beta1", name, "namespaceoffloadings", "offloading")
            status = obj.get("status") or {}
            twin = status.get("remoteNamespaceName")
            if not twin or status.get("offloadingPhase") != "Ready":
                return None
            with contextlib.suppress(kubernetes.client.ApiException):
                p.core("donor").read_namespace(twin)
                return str(twin)
            return None
        twin = wait(remote, f"namespace {name} offloaded to the donor")
        yield name, twin
    finally:
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespace(name, grace_period_seconds=0)


def gpu_pod(name: str, command: str, labels: dict[str, str] | None = None, gpus: int = 1) -> dict[str, Any]:
    """A pod of the project's shape for the donor: a GPU request, the virtual node's toleration and node
    affinity on its cluster id (what liqo_peering's placement writes)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["python3", "-c", command],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": [DONOR_ID]}]}]}}},
        },
    }


def plain_pod(name: str, command: str = "print('ran')") -> dict[str, Any]:
    """A pod nobody aimed anywhere: no GPU, toleration or affinity."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["python3", "-c", command]}]}}
