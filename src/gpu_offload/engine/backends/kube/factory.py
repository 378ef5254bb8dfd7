"""The kubernetes backend as the magic creates it: settings from this kernel's environment."""

from __future__ import annotations

import os

from ....liqo_peering.errors import GpuOffloadError
from ...errors import BackendNotConfigured
from .backend import KubernetesBackend
from .config import from_environment


def kernel_backend() -> KubernetesBackend:
    """A backend for this kernel; raises ``BackendNotConfigured`` naming what is missing."""
    settings = from_environment(os.environ)
    try:
        return KubernetesBackend(settings)
    except GpuOffloadError as exc:
        raise BackendNotConfigured(f"--backend kubernetes: {exc}") from exc
