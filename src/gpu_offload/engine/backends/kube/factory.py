"""The kubernetes backend as a front end creates it: settings from the environment of its process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ....liqo_peering.errors import GpuOffloadError
from ...errors import BackendNotConfigured
from .backend import KubernetesBackend
from .config import from_environment


def kernel_backend(env: Mapping[str, str], cli_kernel: str | None = None) -> KubernetesBackend:
    """A backend for this kernel (or, with ``cli_kernel``, for a shell command of that name); raises
    ``BackendNotConfigured`` naming what is missing."""
    settings = from_environment(env)
    if cli_kernel is not None:
        # no server: the orphan sweep of a Jupyter server this shell may run under must not take the pod
        settings = replace(settings, kernel=cli_kernel, server=None, cli=True)
    try:
        return KubernetesBackend(settings)
    except GpuOffloadError as exc:
        raise BackendNotConfigured(f"--backend kubernetes: {exc}") from exc
