"""A namespace that does not exist: the cell is refused with the namespace's name and the command that
creates it, and nothing is left behind."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError

from .conftest import settings
from .helpers import run_cell


def test_a_missing_namespace_is_named_with_the_command_that_creates_it(api_client: Any, core: Any) -> None:
    backend = KubernetesBackend(settings("team-nowhere"), api_client)
    try:
        with pytest.raises(OffloadUsageError) as err:
            run_cell(backend, "print('never')", {})
    finally:
        backend.close()
    assert "namespace team-nowhere does not exist" in str(err.value)
    assert "kubectl create namespace team-nowhere" in str(err.value)
    assert "team-nowhere" not in {n.metadata.name for n in core.list_namespace().items}
