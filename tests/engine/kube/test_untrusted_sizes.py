"""A donor's stored outputs, on the sandbox with object storage: the kernel reads no more than the size the
frame declares, and downloads nothing it will refuse (a pickle from an untrusted cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import StorageSettings
from gpu_offload.engine.backends.kube.storage import RunStorage, StorageError
from gpu_offload.engine.trust.intake import UntrustedOutputs

from .conftest import BUCKET, EVIL_IMAGE, settings
from .helpers import run_cell
from .test_storage import kube_s3

__all__ = ["kube_s3"]


def test_a_stored_output_larger_than_declared_is_not_read(kube_s3: KubernetesBackend) -> None:
    user_ns: dict[str, Any] = {"x": 1}
    with pytest.raises(StorageError, match="holds more than the 64 bytes the runner declared; nothing was loaded"):
        run_cell(kube_s3, "y = x + 1", user_ns, image=EVIL_IMAGE, env={"EVIL_MODE": "oversize"})
    assert user_ns == {"x": 1}


class CountingReads:
    """The kernel's S3 client, counting the bytes of the run's outputs it downloads."""

    def __init__(self, client: Any) -> None:
        self.client, self.read = client, 0

    def get_object(self, **kwargs: Any) -> Any:
        found = self.client.get_object(**kwargs)
        if "/out-" in kwargs["Key"]:
            self.read += int(found["ContentLength"])
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_stored_pickle_from_an_untrusted_donor_is_refused_without_a_download(
        api_client: Any, namespace: str, s3: Any, s3_endpoint: str) -> None:
    client = CountingReads(s3)
    storage = RunStorage(StorageSettings(BUCKET, s3_endpoint), "alice@example.org", client)
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client,
                                storage=storage)
    user_ns: dict[str, Any] = {"x": 1}
    try:
        with pytest.raises(UntrustedOutputs, match="as 'pickle'"):
            run_cell(backend, "y = x + 1", user_ns, image=EVIL_IMAGE, env={"EVIL_MODE": "stored-pickle"})
    finally:
        backend.close()
    assert client.read == 0, f"the kernel downloaded {client.read} bytes of outputs it then refused"
    assert user_ns == {"x": 1}
