"""Settings every test session shares."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

# Runs started by tests record themselves for the notebook panel; keep those records out of the real
# Jupyter runtime directory. Set at import so kernels and servers started by any fixture inherit it;
# tests that need their own directory still set theirs.
_STATE_DIR = tempfile.mkdtemp(prefix="gpu-offload-test-runs-")
os.environ.setdefault("GPU_OFFLOAD_STATE_DIR", _STATE_DIR)
# Donors stay untrusted unless a test says otherwise: the developer's own setting must not leak in.
os.environ.pop("GPU_OFFLOAD_TRUSTED_CLUSTERS", None)


@pytest.fixture(scope="session", autouse=True)
def _remove_run_records() -> Iterator[None]:
    yield
    shutil.rmtree(_STATE_DIR, ignore_errors=True)
