"""Fixtures for the sandbox tests: one API emulator per test session (Liqo CRDs loaded from ../shared),
a fresh namespace per test, official clients configured from the written kubeconfig, and the origin of the
kubelet and API server tests (``origin``; a module with other donors defines its own)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
from gpu_offload.sandbox.testing import RunningSandbox, running_sandbox

from ..origins import TWO_A100

T = TypeVar("T")
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
LIQO_CRDS = SHARED / "liqo-crds"

# The kubelet's and API server's tests share the hub's and Liqo behaviour tests' origin (tests/origins.py): Liqo's
# real CRDs, two donors of 4 A100, npm's tools (hub images' configurable-http-proxy) found in .ci/node. Each test
# leaves it as it found it.
origin = TWO_A100.fixture()


@pytest.fixture(scope="session")
def api_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSandbox]:
    """The bare API emulator (no Liqo plugin), serving the Liqo CRDs from ../shared/liqo-crds."""
    with running_sandbox(tmp_path_factory.mktemp("api-sandbox"), crds=LIQO_CRDS) as sb:
        yield sb


@pytest.fixture(scope="session")
def k8s(api_sandbox: RunningSandbox) -> Iterator[kubernetes.client.ApiClient]:
    """An official-client ApiClient loaded from the sandbox's kubeconfig file."""
    client = api_sandbox.api_client()
    yield client
    client.close()


@pytest.fixture()
def core(k8s: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(k8s)


@pytest.fixture()
def ns(core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    try:
        core.delete_namespace(name)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def pod_body(name: str, **spec: Any) -> dict[str, Any]:
    """A minimal valid pod manifest."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "python:3.12"}], **spec}}


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll ``check`` until it returns something truthy; a generous limit, never a speed assertion."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


@pytest.fixture()
def wait() -> Callable[..., Any]:
    """``wait(check, what)``: see :func:`wait_for` (test modules cannot import conftest by name)."""
    return wait_for


@pytest.fixture()
def pod() -> Callable[..., dict[str, Any]]:
    """``pod(name, **spec)``: see :func:`pod_body`."""
    return pod_body
