"""A donor's output larger than it declares, on the sandbox with object storage: the kernel reads no more than
the declared size and loads nothing."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_offload.magics.backends.kube.backend import KubernetesBackend
from gpu_offload.magics.backends.kube.storage import StorageError

from .conftest import EVIL_IMAGE
from .helpers import run_cell
from .test_storage import kube_s3

__all__ = ["kube_s3"]


def test_a_stored_output_larger_than_declared_is_not_read(kube_s3: KubernetesBackend) -> None:
    user_ns: dict[str, Any] = {"x": 1}
    with pytest.raises(StorageError, match="holds more than the 64 bytes the runner declared; nothing was loaded"):
        run_cell(kube_s3, "y = x + 1", user_ns, image=EVIL_IMAGE, env={"EVIL_MODE": "oversize"})
    assert user_ns == {"x": 1}
