"""The backends by name: the one place a front end (the magic, ``gpu-offload run``) gets a backend from.

A front end names a backend (``--backend NAME``, or ``auto``) and never imports one, so a new backend is
one more entry in :data:`NAMES` and :func:`create`, and nothing else changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import BackendNotConfigured
from .base import Backend, UserRuns

NAMES = ("local", "kubernetes")
"""Every backend a front end can name, the embedded one first."""


def cluster_configured(env: Mapping[str, str]) -> bool:
    """Whether ``env`` points at a cluster (a namespace, from the hub or the user): what ``auto`` asks."""
    from .kube.config import configured

    return configured(env)


def auto_name(env: Mapping[str, str]) -> str:
    """The backend ``auto`` means: the kubernetes backend when a cluster is configured, else the local one.
    Raises :class:`BackendNotConfigured` when ``GPU_OFFLOAD_BACKEND`` names neither."""
    from ...liqo_peering.environment import InvalidSetting
    from ...liqo_peering.settings import read_kernel

    try:
        read_kernel(env).check("backend")
    except InvalidSetting as exc:
        raise BackendNotConfigured(f"{exc}. Nothing was run.") from None
    return "kubernetes" if cluster_configured(env) else "local"


def user_runs(env: Mapping[str, str]) -> UserRuns | None:
    """The runs of this user that the configured cluster holds, for a process that runs no cells (the runs REST
    API of a Jupyter server, ``gpu-offload runs``): the kubernetes backend's view of them over a client of its
    own, without starting a backend. None when no cluster is configured (or no namespace is known); raises
    when the cluster's client cannot be made (an unreadable kubeconfig)."""
    if not cluster_configured(env):
        return None
    from .kube.user_runs import UserPods

    return UserPods.configured(env)


def create(name: str, cli_kernel: str | None = None) -> Backend:
    """A new backend ``name`` configured from this process's environment.

    ``cli_kernel``: the run is a shell command's (``gpu-offload run``), recorded and labelled under that name
    instead of a kernel's. Raises :class:`BackendNotConfigured` naming what is missing or unknown.
    """
    if name == "local":
        from .local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from .kube.factory import kernel_backend

        return kernel_backend(os.environ, cli_kernel)
    raise BackendNotConfigured(f"backend `{name}` is not one this installation knows: name one of "
                               f"{', '.join(NAMES)}, or auto.")
