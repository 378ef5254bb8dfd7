"""How the kubernetes backend finds its cluster, namespace, image and object storage.

The names are the ones the hub's spawner hook and the Helm overlay set in a user's server
(``GPU_OFFLOAD_BACKEND``, ``GPU_OFFLOAD_NAMESPACE``, ``GPU_OFFLOAD_IMAGE``, ``GPU_OFFLOAD_S3_ENDPOINT``,
``GPU_OFFLOAD_S3_BUCKET``); the cluster itself comes from the in-cluster service account or ``KUBECONFIG``.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BACKEND = "GPU_OFFLOAD_BACKEND"
NAMESPACE = "GPU_OFFLOAD_NAMESPACE"
IMAGE = "GPU_OFFLOAD_IMAGE"
PYTHON = "GPU_OFFLOAD_PYTHON"
S3_ENDPOINT = "GPU_OFFLOAD_S3_ENDPOINT"
S3_BUCKET = "GPU_OFFLOAD_S3_BUCKET"
SERVICE_URL = "GPU_OFFLOAD_SERVICE_URL"
CREATE_OFFLOADING = "GPU_OFFLOAD_CREATE_OFFLOADING"
KERNEL_ID = "GPU_OFFLOAD_KERNEL_ID"
SERVER_ID = "GPU_OFFLOAD_SERVER_ID"
"""Set by the runs server extension in its own environment, so every kernel it starts inherits it."""
SWEEP_SECONDS = "GPU_OFFLOAD_SWEEP_SECONDS"
POLICY = "GPU_OFFLOAD_PLACEMENT_POLICY"
METERED = "GPU_OFFLOAD_METERED"
"""``1`` where the hub's meter runs (the spawner sets it): runner pods carry its finalizer."""
DEFAULT_IMAGE = "python:3.11-slim"
"""A stock image: the runner travels in the bundle, so any image with a same-minor Python works."""


@dataclass(frozen=True)
class StorageSettings:
    """S3-compatible object storage for bundles and outputs too large for a Secret or a log."""

    bucket: str
    endpoint: str | None = None
    """Endpoint URL (None: the SDK's default for the region); credentials come from the usual AWS variables."""
    prefix: str = "gpu-offload"
    url_expiry: int = 3600
    """Seconds a presigned URL stays valid: longer than a run waits for its pod."""


@dataclass(frozen=True)
class KubeSettings:
    """Everything the backend needs to know besides the cluster connection."""

    namespace: str
    image: str = DEFAULT_IMAGE
    python: str = "python3"
    """Interpreter in the image that runs the runner."""
    user: str = "unknown"
    kernel: str = "kernel"
    storage: StorageSettings | None = None
    create_offloading: bool = True
    """Create or widen the NamespaceOffloading when absent (False in a hub: the hub does it)."""
    offloading_timeout: float = 60.0
    watch_seconds: int = 30
    """Server timeout of one pod watch request (re-watched from the last resourceVersion)."""
    service_url: str | None = None
    """The hub service (``GPU_OFFLOAD_SERVICE_URL``): the inventory comes from it, not from cluster-wide lists."""
    hub_token: str = ""
    """The user server's ``JUPYTERHUB_API_TOKEN``, sent to the hub service."""
    server: str | None = None
    """The Jupyter server this kernel runs under (``GPU_OFFLOAD_SERVER_ID``), written on every pod."""
    policy: str = "most-free"
    """Placement policy by name (``GPU_OFFLOAD_PLACEMENT_POLICY``): most-free, bin-pack or first-fit."""
    metered: bool = False
    """Runner pods carry the hub meter's finalizer (``GPU_OFFLOAD_METERED=1``, set by the spawner)."""


def configured(env: Mapping[str, str]) -> bool:
    """Whether this kernel is set up for the kubernetes backend (``--backend`` auto picks it then)."""
    chosen = env.get(BACKEND, "").strip().lower()
    if chosen:
        return chosen == "kubernetes"
    return bool(env.get(NAMESPACE))


def kernel_id(env: Mapping[str, str]) -> str:
    """This kernel's id: Jupyter's (it survives a kernel restart), else host and pid."""
    if env.get(KERNEL_ID):
        return env[KERNEL_ID]
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).stem
        return name.removeprefix("kernel-")
    except Exception:  # noqa: BLE001 - not inside a kernel (tests, scripts): any stable id will do
        return f"{socket.gethostname()}-{os.getpid()}"


def from_environment(env: Mapping[str, str]) -> KubeSettings:
    """Settings from the environment; the namespace is required."""
    from ...errors import BackendNotConfigured

    namespace = env.get(NAMESPACE, "").strip()
    if not namespace:
        raise BackendNotConfigured(
            f"--backend kubernetes: {NAMESPACE} is not set, so there is no namespace to run pods in. Set it "
            "to your offloaded namespace (a hub deployment sets it for you), or use --backend local."
        )
    from ....liqo_peering.placement import POLICIES

    policy = env.get(POLICY, "").strip() or "most-free"
    if policy not in POLICIES:
        raise BackendNotConfigured(
            f"{POLICY}={policy!r} is not a placement policy; use one of {', '.join(POLICIES)} (or unset it for "
            "most-free).")
    bucket = env.get(S3_BUCKET, "").strip()
    storage = StorageSettings(bucket, env.get(S3_ENDPOINT) or None) if bucket else None
    in_hub = bool(env.get(SERVICE_URL))
    create = env.get(CREATE_OFFLOADING, "0" if in_hub else "1").strip().lower() in ("1", "true", "yes")
    return KubeSettings(
        namespace=namespace,
        image=env.get(IMAGE) or DEFAULT_IMAGE,
        python=env.get(PYTHON) or "python3",
        user=env.get("JUPYTERHUB_USER") or getpass.getuser(),
        kernel=kernel_id(env),
        storage=storage,
        create_offloading=create,
        service_url=env.get(SERVICE_URL) or None,
        hub_token=env.get("JUPYTERHUB_API_TOKEN", ""),
        server=env.get(SERVER_ID) or None,
        policy=policy,
        metered=env.get(METERED, "").strip().lower() in ("1", "true", "yes"),
    )
