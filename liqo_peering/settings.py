"""The one place a process of the project reads its ``GPU_OFFLOAD_*`` settings, and the defaults of a run.

:mod:`.environment` defines each variable (name, parser, default, meaning) and the hub's spawner writes them
through those definitions; this module reads them, every variable of a group at once, into frozen records.
Every front end then applies the same defaults: :func:`run_defaults` turns the settings into what the magic,
``gpu-offload run``, the Metaflow decorator and the panel use when a run does not say (GPU model,
trusted-only, queue, priority, memory, image...). A test walks the product's source and finds no other read.

A variable with a bad value does not stop the others from being read: its field keeps the default and the
record names the problem; a reader that depends on it calls :meth:`KernelSettings.check` and fails with the
variable, its value and the fix. Like :mod:`.environment`, this module imports only the standard library and
that module: Metaflow's step pod imports it from the flow's code package (``flows/packaging.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from . import environment as E

Source = Literal["auto", "live", "config"]
FlowBackend = Literal["kubernetes", "local"]


def _field_name(setting: E.Setting[Any], prefix: str) -> str:
    return setting.name.removeprefix(prefix).lower()


@dataclass(frozen=True)
class KernelSettings:
    """What a user's kernel, Jupyter server and shell read (:data:`.environment.KERNEL`); one field per variable,
    named after it (``GPU_OFFLOAD_GPU_MODEL`` is ``gpu_model``); the meaning of each is in :mod:`.environment`."""

    backend: str | None = E.BACKEND.default
    namespace: str | None = E.NAMESPACE.default
    image: str | None = E.IMAGE.default
    image_registry: str | None = E.IMAGE_REGISTRY.default
    python: str = E.PYTHON.default
    gpu_model: str | None = E.GPU_MODEL.default
    s3_bucket: str | None = E.S3_BUCKET.default
    s3_endpoint: str | None = E.S3_ENDPOINT.default
    memory: str | None = E.MEMORY.default
    create_offloading: bool | None = E.CREATE_OFFLOADING.default
    kernel_id: str | None = E.KERNEL_ID.default
    placement_policy: str = E.PLACEMENT_POLICY.default
    sweep_seconds: float = E.SWEEP_SECONDS.default
    service_url: str | None = E.SERVICE_URL.default
    server_id: str | None = E.SERVER_ID.default
    metered: bool = E.METERED.default
    state_dir: str | None = E.STATE_DIR.default
    trusted_clusters: tuple[str, ...] = E.TRUSTED_CLUSTERS.default
    queue: str | None = E.QUEUE.default
    priority: str | None = E.PRIORITY.default
    trusted_only: bool = E.TRUSTED_ONLY.default
    monthly_budget: float | None = E.MONTHLY_BUDGET.default
    session_idle_timeout: float = E.SESSION_IDLE_TIMEOUT.default
    session_protection: float = E.SESSION_PROTECTION.default
    protected_priority: str | None = E.PROTECTED_PRIORITY.default
    session_notice: int = E.SESSION_NOTICE.default
    node_lost_seconds: int = E.NODE_LOST_SECONDS.default
    invalid: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """``(field, message)`` for each variable whose value was refused; that field holds its default."""

    def problem(self, name: str) -> str:
        """What was wrong with the variable of field ``name``, e.g. ``GPU_OFFLOAD_SWEEP_SECONDS='soon' is not a
        number of seconds`` (empty when its value was fine or unset)."""
        return dict(self.invalid).get(name, "")

    def check(self, *names: str) -> KernelSettings:
        """These settings, if the variables of fields ``names`` (all when none is named) held good values;
        else :class:`.environment.InvalidSetting` naming the first bad one, its value and the fix."""
        for name, message in self.invalid:
            if not names or name in names:
                raise E.InvalidSetting(f"{message}{_fix(KERNEL_FIELDS[name])}")
        return self


KERNEL_FIELDS: Mapping[str, E.Setting[Any]] = {_field_name(s, "GPU_OFFLOAD_"): s for s in E.KERNEL}
"""Each field of :class:`KernelSettings` and the variable it is read from (a test keeps both complete)."""


def _fix(setting: E.Setting[Any]) -> str:
    return f"; set it as the docs say or unset it for the default ({setting.documented_default.strip('`')})"


def _read(settings: Mapping[str, E.Setting[Any]], lookup: Callable[[str], Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    values: dict[str, Any] = {}
    invalid: list[tuple[str, str]] = []
    for name, setting in settings.items():
        try:
            values[name] = setting.get(lookup)
        except E.InvalidSetting as exc:
            invalid.append((name, str(exc)))
    return values, invalid


def read_kernel(env: Mapping[str, Any]) -> KernelSettings:
    """The kernel's settings in ``env`` (an environment, a spawner's ``environment``, or a test's dict)."""
    values, invalid = _read(KERNEL_FIELDS, env.get)
    return KernelSettings(**values, invalid=tuple(invalid))


_LAST: tuple[tuple[tuple[str, str], ...], KernelSettings] | None = None


def kernel_settings() -> KernelSettings:
    """This process's settings, as its environment holds them now.

    Parsed once for as long as the ``GPU_OFFLOAD_*`` variables do not change; a notebook's ``%env`` that sets
    one (e.g. ``GPU_OFFLOAD_MEMORY``, or the queue an error named) is seen by the next run, as before.
    """
    global _LAST
    env = os.environ  # keys first: decoding only the names, and the values of ours, halves a warm cell's look
    snapshot = tuple((k, env[k]) for k in sorted(k for k in env if k.startswith("GPU_OFFLOAD_")))
    last = _LAST
    if last is not None and last[0] == snapshot:
        return last[1]
    settings = read_kernel(dict(snapshot))
    _LAST = (snapshot, settings)
    return settings


@dataclass(frozen=True)
class RunDefaults:
    """What a run gets when it does not say: the same for a cell, a script, a Metaflow step and the panel."""

    gpu_model: str | None = None
    """Model (or ``A,B`` models in order) of a run without ``--gpu-model``; None: any."""
    trusted_only: bool = False
    """Every run on clusters the origin trusts, as ``--trusted-only``."""
    queue: str | None = None
    """The Kueue LocalQueue runs wait in; None: the namespace's one LocalQueue, found at the first run, else
    no queueing."""
    priority: str | None = None
    """Kueue priority class of a run without ``--priority``."""
    memory: str | None = None
    """Memory request and limit of a runner pod (a Kubernetes quantity); None: the image's default."""
    image: str | None = None
    """Runner image of a run without ``--image``; None: the project's runner image for the kernel's Python."""
    placement_policy: str = E.PLACEMENT_POLICY.default
    """How placement ranks the clusters with room."""


def run_defaults(settings: KernelSettings) -> RunDefaults:
    """The defaults every front end applies, from the kernel's settings (its environment)."""
    return RunDefaults(gpu_model=settings.gpu_model, trusted_only=settings.trusted_only, queue=settings.queue,
                       priority=settings.priority, memory=settings.memory, image=settings.image,
                       placement_policy=settings.placement_policy)


# --- Metaflow: METAFLOW_GPU_OFFLOAD_* through Metaflow's lookup, the kernel's settings beneath ----------------
@dataclass(frozen=True)
class FlowSettings:
    """Defaults for every ``@gpu_offload`` step of a deployment (:data:`.environment.FLOW`)."""

    cluster: str | None = None
    """Cluster used when a step says ``cluster="auto"`` (``METAFLOW_GPU_OFFLOAD_CLUSTER``)."""
    gpu_model: str | None = None
    """Model used when a step names none (``METAFLOW_GPU_OFFLOAD_GPU_MODEL``). Not the run default: a cell's
    default may list models to try in order, a step names one."""
    namespace: str | None = None
    """Offloaded namespace the step pods go to unless ``@kubernetes(namespace=...)`` says otherwise."""
    inventory: str | None = None
    """Path of an inventory JSON file: clusters and GPUs known offline, for checks without a cluster."""
    source: Source = "auto"
    """``live``: ask the cluster, fail if unreachable; ``config``: never ask; ``auto``: ask, fall back."""
    backend: FlowBackend = "kubernetes"
    """``local`` leaves ``@gpu_offload`` steps as written: they run in the local process (CPU without a GPU)."""
    policy: str = "most-free"
    """Placement policy by name (``METAFLOW_GPU_OFFLOAD_PLACEMENT_POLICY``): most-free, bin-pack, first-fit."""
    queue: str | None = None
    """Kueue LocalQueue of the step Jobs (``METAFLOW_GPU_OFFLOAD_QUEUE``, else the run default); None: the
    namespace's one LocalQueue where placement asks the cluster, else no queueing."""
    priority: str | None = None
    """Kueue priority class of steps that name none (``METAFLOW_GPU_OFFLOAD_PRIORITY``, else the run default)."""
    node_lost_seconds: int = E.NODE_LOST_SECONDS.default
    """Seconds a ``run``'s step pod tolerates its node being not ready or unreachable
    (``GPU_OFFLOAD_NODE_LOST_SECONDS``, as the kernel's runner pods)."""


def read_flow(lookup: Callable[[str], object], kernel_env: Mapping[str, str] | None = None) -> FlowSettings:
    """Settings from ``lookup(key)`` (Metaflow's ``from_conf``, or a dict's ``get``); a step's queue and priority
    fall back to the run defaults of ``kernel_env`` (what the hub's spawner set for the user's server), so a flow
    run from a notebook's terminal queues like its cells. Raises :class:`.environment.InvalidSetting` naming a
    bad variable."""
    kernel = read_kernel(kernel_env or {})
    defaults = run_defaults(kernel)
    return FlowSettings(
        cluster=E.FLOW_CLUSTER.get(lookup),
        gpu_model=E.FLOW_GPU_MODEL.get(lookup),
        namespace=E.FLOW_NAMESPACE.get(lookup),
        inventory=E.FLOW_INVENTORY.get(lookup),
        source=cast(Source, E.FLOW_SOURCE.get(lookup)),
        backend=cast(FlowBackend, E.FLOW_BACKEND.get(lookup)),
        policy=E.FLOW_POLICY.get(lookup),
        queue=E.FLOW_QUEUE.get(lookup) or defaults.queue,
        priority=E.FLOW_PRIORITY.get(lookup) or defaults.priority,
        node_lost_seconds=kernel.check("node_lost_seconds").node_lost_seconds,
    )


def recorded_decision(env: Mapping[str, str]) -> str | None:
    """The placement decided at validation, as a step's pod finds it (``METAFLOW_GPU_OFFLOAD_PLACEMENT``)."""
    # looked up by its full name: Setting.read takes Metaflow's key (without METAFLOW_), an environment does not
    return E.RECORDED_PLACEMENT.get(lambda _key: env.get(E.RECORDED_PLACEMENT.name))


# --- the hub and a donor's node labeller ---------------------------------------------------------------------
def hub_config_path(env: Mapping[str, str]) -> str | None:
    """Path of the hub's configuration file (``GPU_OFFLOAD_CONFIG``); None when unset."""
    return E.HUB_CONFIG.read(env)


@dataclass(frozen=True)
class DonorSettings:
    """What the donor chart's node labeller reads (:data:`.environment.DONOR`)."""

    label_interval: float = E.LABEL_INTERVAL.default
    runtime_config: str | None = E.RUNTIME_CONFIG.default
    device_plugin_config: str | None = E.DEVICE_PLUGIN_CONFIG.default


def read_donor(env: Mapping[str, str]) -> DonorSettings:
    """The labeller's settings; raises :class:`.environment.InvalidSetting` naming a bad variable and the fix."""
    donor = {_field_name(s, "GPU_OFFLOAD_"): s for s in E.DONOR}
    values, invalid = _read(donor, env.get)
    for name, message in invalid:
        raise E.InvalidSetting(f"{message}{_fix(donor[name])}")
    return DonorSettings(**values)
