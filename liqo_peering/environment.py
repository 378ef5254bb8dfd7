"""The environment variables one process of the project sets for another: names, types, defaults, meaning.

The hub's spawner writes the user server's ``GPU_OFFLOAD_*`` variables, the kernel (magic, backend, runs
extension) reads them, the chart points the hub at its configuration, and Metaflow carries
``METAFLOW_GPU_OFFLOAD_*`` from the deploying process into the step's pod. All of them are defined here
once, so writer and reader cannot drift; the settings tables in the docs are checked against these
definitions by a test. Writers use these definitions; only :mod:`.settings` reads them (a test walks the
product's source for any other read).

Metaflow's step pod imports this module from the flow's code package with nothing but the standard library
(``flows/packaging.py``), so it imports no other module of the project.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

POLICY_NAMES = ("most-free", "bin-pack", "first-fit")
"""Placement policies by name (``liqo_peering.placement.POLICIES`` implements them; a test keeps both equal)."""


class InvalidSetting(ValueError):
    """A variable holds a value its setting refuses; the message names the variable, the value and the fix."""


def text(raw: str) -> str:
    """Any text (already stripped, never empty)."""
    return raw


def flag(raw: str) -> bool:
    """``1``, ``true`` or ``yes`` (any case) is on; anything else is off."""
    return raw.lower() in ("1", "true", "yes")


def seconds(raw: str) -> float:
    """A number of seconds."""
    try:
        return float(raw)
    except ValueError:
        raise ValueError("is not a number of seconds") from None


def names(raw: str) -> tuple[str, ...]:
    """Comma-separated names, blanks dropped."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def amount(raw: str) -> float:
    """A finite number of 0 or more (a cost, in the unit of the donors' prices)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a number; write it like 250 or 99.5") from None
    if not 0 <= value < float("inf"):
        raise ValueError("must be a number of 0 or more")
    return value


def choice(*allowed: str) -> Callable[[str], str]:
    """One of ``allowed``, spelled exactly."""

    def parse(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"is not allowed; use one of {', '.join(allowed)}")
        return raw

    return parse


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One variable: what a process sets and another reads."""

    name: str
    """The variable as a user or a process sets it."""
    parse: Callable[[str], T]
    """From the stripped, non-empty value; raises ValueError with what is wrong (the name is added)."""
    default: T
    """When unset or empty."""
    doc: str
    """What it means, for readers of this module."""
    shown_default: str = ""
    """The default as the docs write it, where it is not the literal ``default`` (e.g. it depends)."""

    @property
    def key(self) -> str:
        """What a lookup asks for: Metaflow's ``from_conf`` takes the name without ``METAFLOW_``."""
        return self.name.removeprefix("METAFLOW_")

    @property
    def documented_default(self) -> str:
        """The default column of this setting's row in the docs."""
        if self.shown_default:
            return self.shown_default
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return "`1`" if self.default else "`0`"
        return f"`{self.default:g}`" if isinstance(self.default, float) else f"`{self.default}`"

    def get(self, lookup: Callable[[str], Any]) -> T:
        """The value from ``lookup(self.key)`` (an environment's ``get``, or Metaflow's ``from_conf``)."""
        value = lookup(self.key)
        raw = str(value).strip() if value is not None else ""
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise InvalidSetting(f"{self.name}={raw!r} {exc}") from None

    def read(self, env: Mapping[str, str]) -> T:
        """The value in ``env`` (``os.environ``, or the mapping a test builds)."""
        return self.get(env.get)


def _kernel(name: str, parse: Callable[[str], T], default: T, doc: str, shown: str = "") -> Setting[T]:
    return Setting("GPU_OFFLOAD_" + name, parse, default, doc, shown)


# --- a user's kernel and Jupyter server (the hub's spawner sets most of them) -------------------------------
BACKEND = _kernel("BACKEND", lambda raw: choice("kubernetes", "local")(raw.lower()), None,
                  "Which backend `--backend auto` picks; unset: kubernetes when NAMESPACE is set.")
NAMESPACE = _kernel("NAMESPACE", text, None,
                    "Offloaded namespace the runner pods go to; unset: the kubeconfig context's, as kubectl.",
                    "the kubeconfig context's")
IMAGE = _kernel("IMAGE", text, None,
                "Runner pods' image when a cell gives no --image; unset: the project's runner image for the "
                "kernel's Python minor version (with torch when the kernel has torch), from images.json.",
                "the runner image of the kernel's Python")
IMAGE_REGISTRY = _kernel("IMAGE_REGISTRY", text, None,
                         "Registry (and path) the project's runner images were pushed to, put in front of the "
                         "default runner image's name; unset: the bare name.", "none")
PYTHON = _kernel("PYTHON", text, "python3", "Interpreter inside the image.")
GPU_MODEL = _kernel("GPU_MODEL", text, None,
                    "GPU model of cells that give no --gpu-model (a hub's GPU profile sets it).")
S3_BUCKET = _kernel("S3_BUCKET", text, None, "Object storage for bundles and outputs too large for the API.")
S3_ENDPOINT = _kernel("S3_ENDPOINT", text, None, "Endpoint of that storage (unset: the SDK's default).")
MEMORY = _kernel("MEMORY", text, None, "Memory request and limit of runner pods, read at each cell.")
CREATE_OFFLOADING = _kernel("CREATE_OFFLOADING", flag, None,
                            "Create or widen the NamespaceOffloading; unset: yes, except in a hub.",
                            "`1`, `0` in a hub")
KERNEL_ID = _kernel("KERNEL_ID", text, None, "This kernel's id on its pods.", "Jupyter's kernel id")
PLACEMENT_POLICY = _kernel("PLACEMENT_POLICY", choice(*POLICY_NAMES), "most-free", "Placement policy by name.")
SWEEP_SECONDS = _kernel("SWEEP_SECONDS", seconds, 60.0, "Seconds between orphan sweeps; 0: never.")
SERVICE_URL = _kernel("SERVICE_URL", text, None, "The hub service; the kernel's inventory comes from it.")
SERVER_ID = _kernel("SERVER_ID", text, None,
                    "The Jupyter server of this kernel, set by the runs extension for its kernels.",
                    "set by the server")
METERED = _kernel("METERED", flag, False, "Runner pods carry the hub meter's finalizer.")
STATE_DIR = _kernel("STATE_DIR", text, None, "Where a server's kernels record their runs for the panel.",
                    "Jupyter's runtime directory")
QUEUE = _kernel("QUEUE", text, None,
                "Kueue LocalQueue runner pods wait in (the hub sets it when queueing is on); unset: the one "
                "LocalQueue of the namespace, found at the first cell, else no queueing.",
                "none")
PRIORITY = _kernel("PRIORITY", text, None,
                   "Kueue priority class of cells that give no --priority (the hub sets the chart's default).",
                   "none")
SESSION_IDLE_TIMEOUT = _kernel("SESSION_IDLE_TIMEOUT", seconds, 0.0,
                               "Seconds a `--session` may sit idle holding its GPUs before the kernel ends it (a hub "
                               "writes the chart's `offload.sessionIdleTimeout`); 0: never.")
TRUSTED_CLUSTERS: Setting[tuple[str, ...]] = _kernel("TRUSTED_CLUSTERS", names, tuple[str, ...](),
                           "Cluster ids trusted with pickled outputs (the origin decides; a hub writes its chart's).",
                           "none")
TRUSTED_ONLY = _kernel("TRUSTED_ONLY", flag, False,
                       "Cells run on trusted clusters only, as with `--trusted-only` (a hub writes its chart's "
                       "`offload.trustedOnly`): the default of `c.GpuOffloadMagics.trusted_only`.")
MONTHLY_BUDGET: Setting[float | None] = _kernel(
    "MONTHLY_BUDGET", amount, None,
    "What this user's runs may cost per month (UTC); a cell that would start past it is refused before launch "
    "(the hub writes its chart's `offload.monthlyBudgetPerUser`; the spend is read from SERVICE_URL).", "none")

KERNEL: tuple[Setting[Any], ...] = (
    BACKEND, NAMESPACE, IMAGE, IMAGE_REGISTRY, PYTHON, GPU_MODEL, S3_BUCKET, S3_ENDPOINT, MEMORY, CREATE_OFFLOADING,
    KERNEL_ID, PLACEMENT_POLICY, SWEEP_SECONDS, SERVICE_URL, SERVER_ID, METERED, STATE_DIR,
    TRUSTED_CLUSTERS, QUEUE, PRIORITY, TRUSTED_ONLY, MONTHLY_BUDGET, SESSION_IDLE_TIMEOUT,
)
"""What a user's kernel and server read (README: the kubernetes backend's environment variables)."""

# --- the hub -----------------------------------------------------------------------------------------------
HUB_CONFIG = _kernel("CONFIG", text, None, "Path of the chart's configuration file (its ConfigMap, mounted).")
HUB: tuple[Setting[Any], ...] = (HUB_CONFIG,)

# --- a donor's node labeller (the donor chart's DaemonSet sets them) -----------------------------------------
LABEL_INTERVAL = _kernel("LABEL_INTERVAL", seconds, 300.0, "Seconds between two passes of the node labeller.")
RUNTIME_CONFIG = _kernel("RUNTIME_CONFIG", text, None,
                         "The host's NVIDIA Container Toolkit config.toml as mounted in the labeller's pod; unset: "
                         "the toolkit's default path under the host mount.", "the toolkit's default path")
DONOR: tuple[Setting[Any], ...] = (LABEL_INTERVAL, RUNTIME_CONFIG)
"""What the donor chart's node labeller reads."""


# --- Metaflow: METAFLOW_GPU_OFFLOAD_*, or the same key in Metaflow's config file ----------------------------
def _flow(name: str, parse: Callable[[str], T], default: T, doc: str, shown: str = "") -> Setting[T]:
    return Setting("METAFLOW_GPU_OFFLOAD_" + name, parse, default, doc, shown)


FLOW_SOURCE = _flow("PLACEMENT_SOURCE", choice("auto", "live", "config"), "auto",
                    "live: ask the cluster, fail if unreachable; config: never ask; auto: ask, fall back.")
FLOW_INVENTORY = _flow("INVENTORY", text, None, "Inventory JSON file: clusters and GPUs known offline.")
FLOW_CLUSTER = _flow("CLUSTER", text, None, 'Cluster of steps that say cluster="auto".')
FLOW_POLICY = _flow("PLACEMENT_POLICY", choice(*POLICY_NAMES), "most-free", "Placement policy by name.")
FLOW_GPU_MODEL = _flow("GPU_MODEL", text, None, "Model of steps that name none.")
FLOW_NAMESPACE = _flow("NAMESPACE", text, None, "Offloaded namespace of the step pods.", "Metaflow's")
FLOW_BACKEND = _flow("BACKEND", choice("kubernetes", "local"), "kubernetes",
                     "local leaves @gpu_offload steps as written (they run in the local process).")
FLOW_QUEUE = _flow("QUEUE", text, None,
                   "Kueue LocalQueue the step Jobs wait in; unset: the hub's `GPU_OFFLOAD_QUEUE`, else the one "
                   "LocalQueue of the step pods' namespace, else no queueing.",
                   "`GPU_OFFLOAD_QUEUE`")
FLOW_PRIORITY = _flow("PRIORITY", text, None,
                      "Kueue priority class of steps that give no `priority=`; unset: the hub's `GPU_OFFLOAD_PRIORITY`.",
                      "`GPU_OFFLOAD_PRIORITY`")
FLOW: tuple[Setting[Any], ...] = (
    FLOW_SOURCE, FLOW_INVENTORY, FLOW_CLUSTER, FLOW_POLICY, FLOW_GPU_MODEL, FLOW_NAMESPACE, FLOW_BACKEND,
    FLOW_QUEUE, FLOW_PRIORITY,
)
"""What ``@gpu_offload`` reads where a flow is validated (README: the Metaflow settings)."""

# --- written and read by the project itself, never by a user -----------------------------------------------
RECORDED_PLACEMENT = _flow("PLACEMENT", text, None,
                           "The placement decided at validation, read back by the mutator in the step's pod.")
BUNDLE_URL = _kernel("BUNDLE_URL", text, None, "Where a runner pod fetches a bundle too large for a Secret.")
OUTPUT_FORMAT = _kernel("OUTPUT_FORMAT", text, None,
                        "`safe` on a runner pod placed on an untrusted cluster: its outputs come back as plain data "
                        "(the runner spells it itself; a test keeps both equal).")
INTERNAL: tuple[Setting[Any], ...] = (RECORDED_PLACEMENT, BUNDLE_URL, OUTPUT_FORMAT)

ALL: tuple[Setting[Any], ...] = (*KERNEL, *HUB, *DONOR, *FLOW, *INTERNAL)


def assignments(values: Mapping[Setting[Any], object]) -> dict[str, str]:
    """Variables to set for another process: each setting's name and its value as text; None is left out."""
    out: dict[str, str] = {}
    for setting, value in values.items():
        if value is None or value == "":
            continue
        out[setting.name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out
