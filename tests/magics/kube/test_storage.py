"""Inputs too large for a Secret and large outputs travel through S3-compatible storage (a moto server on
127.0.0.1) by presigned URLs: the pod holds no credentials, and the run's objects are removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.magics.backends.kube.backend import KubernetesBackend
from gpu_offload.magics.backends.kube.config import StorageSettings

from .conftest import BUCKET, settings
from .helpers import Sink, run_cell


@pytest.fixture()
def kube_s3(api_client: Any, namespace: str, s3: Any, s3_endpoint: str) -> Iterator[KubernetesBackend]:
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client)
    yield backend
    backend.close()


def test_large_inputs_and_outputs_go_through_object_storage_and_are_removed(kube_s3: KubernetesBackend,
                                                                            s3: Any, core: Any,
                                                                            namespace: str) -> None:
    big = bytes(range(256)) * (8 << 10)  # 2 MiB: more than a Secret holds
    user_ns: dict[str, Any] = {"big": big}
    cell = "import os\nprint('creds in pod:', 'AWS_SECRET_ACCESS_KEY' in os.environ)\nn = len(big)\nback = big[::-1] * 2"
    pods: list[Any] = []

    def grab_pod(_: str) -> None:
        if not pods:
            pods.extend(core.list_namespaced_pod(namespace).items)

    outcome, sink, _ = run_cell(kube_s3, cell, user_ns, Sink(on_line=grab_pod))
    assert outcome.status == "ok", outcome.error
    assert user_ns["n"] == len(big) and user_ns["back"] == big[::-1] * 2
    assert "creds in pod: False" in sink.text
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
    env = {e.name: e.value for e in pods[0].spec.containers[0].env}
    assert env["GPU_OFFLOAD_BUNDLE_URL"].startswith(kube_s3.settings.storage.endpoint)  # presigned, no credentials
