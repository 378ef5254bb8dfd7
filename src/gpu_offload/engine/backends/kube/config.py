"""How the kubernetes backend finds its cluster, namespace, image and object storage.

The variables are defined in ``liqo_peering.environment`` (the hub's spawner writes them through the same
definitions); the cluster itself comes from the in-cluster service account or ``KUBECONFIG``.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ....liqo_peering import environment as E
from ....liqo_peering.settings import read_kernel

DEFAULT_IMAGE = E.IMAGE.default
"""None: the project's runner image for this kernel (``gpu_offload.images.default_runner``)."""


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
    image: str | None = DEFAULT_IMAGE
    """Runner pods' image when a cell names none; None: the project's runner image for this kernel's Python
    minor version (and torch), from the package's image manifest."""
    image_registry: str = ""
    """Where the project's runner images were pushed (``GPU_OFFLOAD_IMAGE_REGISTRY``), before their names."""
    python: str = E.PYTHON.default
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
    policy: str = E.PLACEMENT_POLICY.default
    """Placement policy by name (``GPU_OFFLOAD_PLACEMENT_POLICY``): most-free, bin-pack or first-fit."""
    metered: bool = False
    """Runner pods carry the hub meter's finalizer (``GPU_OFFLOAD_METERED=1``, set by the spawner)."""
    cli: bool = False
    """Runs of ``gpu-offload run``: their pods are labelled CLI runs and carry no server (no sweep takes them)."""
    queue: str | None = None
    """The Kueue LocalQueue runner pods wait in (``GPU_OFFLOAD_QUEUE``); None: the one LocalQueue of the
    namespace, found at the first launch, and queueing off when there is none. With queueing on the kernel never
    moves a pod that could not start; one Kueue evicted for not starting in time (``waitForPodsReady``, which
    deletes a plain pod) is queued again once."""
    priority: str | None = None
    """Kueue priority class of cells without ``--priority`` (``GPU_OFFLOAD_PRIORITY``)."""
    session_idle_timeout: float = 0.0
    """Seconds a session may sit idle holding its GPUs before this kernel ends it
    (``GPU_OFFLOAD_SESSION_IDLE_TIMEOUT``, the chart's ``offload.sessionIdleTimeout``); 0: never."""
    session_protection: float = 0.0
    """Seconds a queued session pod runs at ``protected_priority`` before the kernel relabels it to its own class
    (``GPU_OFFLOAD_SESSION_PROTECTION``); 0: no protection."""
    protected_priority: str | None = None
    """The WorkloadPriorityClass of a protected session pod (``GPU_OFFLOAD_PROTECTED_PRIORITY``)."""
    session_notice: int = E.SESSION_NOTICE.default
    """Seconds a session pod has from SIGTERM to its end, to write its checkpoint (``GPU_OFFLOAD_SESSION_NOTICE``,
    the chart's ``offload.sessionNotice``): its termination grace period."""
    node_lost_seconds: int = E.NODE_LOST_SECONDS.default
    """Seconds runner pods tolerate their node being not ready or unreachable before Kubernetes evicts them
    (``GPU_OFFLOAD_NODE_LOST_SECONDS``); Kubernetes' default, 300, would hold a lost run five minutes more."""

    trusted: tuple[str, ...] = ()
    """Cluster ids the origin trusts (``GPU_OFFLOAD_TRUSTED_CLUSTERS``, a hub's spawner writes its chart's):
    outputs from any other cluster come back only as plain data."""
    budget: float | None = None
    """What this user's runs may cost per month (``GPU_OFFLOAD_MONTHLY_BUDGET``); None: no budget."""


def configured(env: Mapping[str, str]) -> bool:
    """Whether this kernel is set up for the kubernetes backend (``--backend`` auto picks it then)."""
    settings = read_kernel(env)
    if settings.backend or settings.problem("backend"):
        return settings.backend == "kubernetes"
    return bool(settings.namespace)


def user_name(env: Mapping[str, str]) -> str:
    """Whose runs these are: the hub user of the server, else the account's login name."""
    return env.get("JUPYTERHUB_USER") or getpass.getuser()


def kernel_id(env: Mapping[str, str]) -> str:
    """This kernel's id: Jupyter's (it survives a kernel restart), else host and pid."""
    chosen = read_kernel(env).kernel_id
    if chosen:
        return chosen
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).stem
        return name.removeprefix("kernel-")
    except Exception:  # noqa: BLE001 - not inside a kernel (tests, scripts): any stable id will do
        return f"{socket.gethostname()}-{os.getpid()}"


def from_environment(env: Mapping[str, str]) -> KubeSettings:
    """Settings from the environment; the namespace is required."""
    # the Kubernetes client is imported only once a backend starts, not when the magic loads
    from ....liqo_peering.client import kubeconfig_namespace
    from ...errors import BackendNotConfigured

    settings = read_kernel(env)
    # as kubectl does: the kubeconfig's current context names the namespace when nothing else does
    namespace = settings.namespace or kubeconfig_namespace(env.get("KUBECONFIG"))
    if not namespace:
        raise BackendNotConfigured(
            f"--backend kubernetes: {E.NAMESPACE.name} is not set and there is no kubeconfig "
            f"({env.get('KUBECONFIG') or '~/.kube/config'}) whose context names one, so there is no namespace to "
            "run pods in. Point KUBECONFIG at your origin cluster's kubeconfig, set the namespace (a hub "
            "deployment sets it for you), or use --backend local."
        )
    try:
        settings.check("placement_policy", "create_offloading", "metered", "trusted_clusters", "monthly_budget",
                       "session_idle_timeout", "session_protection", "session_notice", "node_lost_seconds")
    except E.InvalidSetting as exc:
        raise BackendNotConfigured(str(exc)) from None
    storage = StorageSettings(settings.s3_bucket, settings.s3_endpoint) if settings.s3_bucket else None
    create = settings.create_offloading
    return KubeSettings(
        namespace=namespace,
        image=settings.image,
        image_registry=settings.image_registry or "",
        python=settings.python,
        user=user_name(env),
        kernel=kernel_id(env),
        storage=storage,
        create_offloading=(not settings.service_url) if create is None else create,
        service_url=settings.service_url,
        hub_token=env.get("JUPYTERHUB_API_TOKEN", ""),
        server=settings.server_id,
        policy=settings.placement_policy,
        metered=settings.metered,
        queue=settings.queue,
        priority=settings.priority,
        trusted=settings.trusted_clusters,
        budget=settings.monthly_budget,
        session_idle_timeout=max(0.0, settings.session_idle_timeout),
        session_protection=max(0.0, settings.session_protection),
        protected_priority=settings.protected_priority,
        session_notice=settings.session_notice,
        node_lost_seconds=settings.node_lost_seconds,
    )
