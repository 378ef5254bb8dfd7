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
    """What it means, in Markdown: the meaning column of its row in the docs (``docs/generate.py`` writes
    the tables from these definitions)."""
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
                  "`kubernetes` or `local`: what `--backend auto` picks; unset, kubernetes when "
                  "`GPU_OFFLOAD_NAMESPACE` is set")
NAMESPACE = _kernel("NAMESPACE", text, None,
                    "namespace the runner pods go to; it must exist and be offloaded (below); unset, the "
                    "kubeconfig's current context names it (else `default`), as kubectl does",
                    "the kubeconfig context's")
IMAGE = _kernel("IMAGE", text, None,
                "image of runner pods when a cell gives no `--image`; unset, the project's runner image for "
                "the kernel's Python minor version (`runner-cuda` when the kernel has torch; names in "
                "[images/README.md](../images/README.md)); any image whose Python has the kernel's minor "
                "version works, the runner travels with the cell",
                "the runner image of the kernel's Python")
IMAGE_REGISTRY = _kernel("IMAGE_REGISTRY", text, None,
                         "registry (and path) the runner images were pushed to, put in front of the default "
                         "runner image's name, e.g. `registry.example.org/ml`", "none")
PYTHON = _kernel("PYTHON", text, "python3", "interpreter inside the image")
GPU_MODEL = _kernel("GPU_MODEL", text, None,
                    "GPU model of cells that give no `--gpu-model` (the hub's GPU profiles set it; "
                    "`c.GpuOffloadMagics.default_gpu_model` overrides it)")
S3_BUCKET = _kernel("S3_BUCKET", text, None, "S3-compatible storage for inputs too large for a Secret and for"
                                             " outputs, and where `gpu-offload run` scripts' logs are kept "
                                             "after their pods ([notebook.md](notebook.md#from-a-shell)); "
                                             "credentials from the usual `AWS_*` variables, in the kernel "
                                             "only")
S3_ENDPOINT = _kernel("S3_ENDPOINT", text, None, "endpoint URL of that storage (unset: AWS's own)")
MEMORY = _kernel("MEMORY", text, None, "memory request and limit of runner pods, e.g. `32Gi` (`%env "
                                       "GPU_OFFLOAD_MEMORY=32Gi` for the next cells)")
CREATE_OFFLOADING = _kernel("CREATE_OFFLOADING", flag, None,
                            "create or widen the namespace's NamespaceOffloading when it is missing",
                            "`1`, `0` in a hub")
KERNEL_ID = _kernel("KERNEL_ID", text, None, "labels the pods; cleanup after a crash uses it", "Jupyter's kernel id")
PLACEMENT_POLICY = _kernel("PLACEMENT_POLICY", choice(*POLICY_NAMES), "most-free", "`most-free` (spread, "
                                                                                   "cheapest on ties), "
                                                                                   "`bin-pack` (fill the "
                                                                                   "fullest node first) or "
                                                                                   "`first-fit`; the chart "
                                                                                   "sets it from "
                                                                                   "`offload.placementPolicy`;"
                                                                                   " "
                                                                                   "[bench/FINDINGS.md](../bench/FINDINGS.md)"
                                                                                   " replays a production "
                                                                                   "trace with each")
SWEEP_SECONDS = _kernel("SWEEP_SECONDS", seconds, 60.0, "how often a Jupyter server deletes the pods of its "
                                                        "ended kernels (orphan sweep, below); `0` never")
SERVICE_URL = _kernel("SERVICE_URL", text, None, "the hub service; set, the inventory comes from its "
                                                 "`api/inventory` (the spawner sets it)")
SERVER_ID = _kernel("SERVER_ID", text, None,
                    "the Jupyter server of a kernel, on its pods (orphan sweep, below)",
                    "set by the server")
METERED = _kernel("METERED", flag, False, "`1`: runner pods carry the hub meter's finalizer (the spawner sets"
                                          " it)")
STATE_DIR = _kernel("STATE_DIR", text, None, "where a server's kernels record their runs for the panel",
                    "Jupyter's runtime directory")
QUEUE = _kernel("QUEUE", text, None,
                "the Kueue LocalQueue runner pods wait in, set by the spawner when the chart's "
                "`queueing.kueue.enabled` is on; unset, the one LocalQueue of the namespace (listed once, at "
                "the first cell), else no queueing ([queueing](queueing.md))",
                "none")
PRIORITY = _kernel("PRIORITY", text, None,
                   "Kueue priority class of cells without `--priority` (the spawner sets the chart's "
                   "`queueing.kueue.defaultPriority`)",
                   "none")
SESSION_IDLE_TIMEOUT = _kernel("SESSION_IDLE_TIMEOUT", seconds, 0.0,
                               "seconds a `--session` may sit idle holding its GPUs before the kernel ends it"
                               " and deletes its pod, saying so at that session's next cell and in "
                               "`%gpu_offload status`; the spawner sets the chart's "
                               "`offload.sessionIdleTimeout`; `0` never")
SESSION_PROTECTION = _kernel("SESSION_PROTECTION", seconds, 0.0,
                             "with queueing on: seconds a `--session` pod runs at `GPU_OFFLOAD_PROTECTED_PRIORITY` "
                             "after it starts, so Kueue does not preempt it in its first minutes; then the kernel "
                             "relabels it to its own class ([sessions](sessions.md)); `0` never")
def whole_seconds(raw: str) -> int:
    """A whole number of seconds, 0 or more."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("is not a whole number of seconds; write it like 10") from None
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


NODE_LOST_SECONDS = _kernel("NODE_LOST_SECONDS", whole_seconds, 10,
                            "seconds a runner pod stays on a donor's node once Kubernetes has marked it not ready "
                            "or unreachable (about 50 s after it stopped answering), before Kubernetes evicts the "
                            "pod and the run is retried elsewhere or reported lost; unset, Kubernetes' own default "
                            "would keep it 300 s more ([kubernetes](kubernetes.md)); a `run`'s Metaflow step pods "
                            "too ([metaflow](metaflow.md))")
SESSION_NOTICE = _kernel("SESSION_NOTICE", whole_seconds, 60,
                         "seconds a `--session` pod has between being told to stop (SIGTERM: Kueue's preemption, "
                         "a drain, an eviction) and being killed: its runner interrupts the cell and writes the "
                         "session's checkpoint in that time (its pod's termination grace period); the spawner sets "
                         "the chart's `offload.sessionNotice` ([sessions](sessions.md))")
PROTECTED_PRIORITY = _kernel("PROTECTED_PRIORITY", text, None,
                             "the Kueue WorkloadPriorityClass a protected session pod starts with (above every class "
                             "that may preempt); unset: no protection", "none")
TRUSTED_CLUSTERS: Setting[tuple[str, ...]] = _kernel("TRUSTED_CLUSTERS", names, tuple[str, ...](),
                           "comma-separated cluster ids the origin trusts with pickled outputs; a hub writes "
                           "its chart's `clusters.<id>.trusted` ([security](security.md))",
                           "none")
TRUSTED_ONLY = _kernel("TRUSTED_ONLY", flag, False,
                       "`1`: cells run on trusted clusters only, as with `--trusted-only` (default of "
                       "`c.GpuOffloadMagics.trusted_only`; a hub writes its chart's `offload.trustedOnly`)")
MONTHLY_BUDGET: Setting[float | None] = _kernel(
    "MONTHLY_BUDGET", amount, None,
    "what your runs may cost per month (UTC); a cell that would start a pod past it is refused before launch,"
    " running cells go on; the spend is read from the hub service's `api/me` (the spawner sets it from the "
    "chart's `offload.monthlyBudgetPerUser`; [hub](hub.md#cost-and-budgets))", "none")

KERNEL: tuple[Setting[Any], ...] = (
    BACKEND, NAMESPACE, IMAGE, IMAGE_REGISTRY, PYTHON, GPU_MODEL, S3_BUCKET, S3_ENDPOINT, MEMORY, CREATE_OFFLOADING,
    KERNEL_ID, PLACEMENT_POLICY, SWEEP_SECONDS, SERVICE_URL, SERVER_ID, METERED, STATE_DIR,
    TRUSTED_CLUSTERS, QUEUE, PRIORITY, TRUSTED_ONLY, MONTHLY_BUDGET, SESSION_IDLE_TIMEOUT, SESSION_PROTECTION,
    PROTECTED_PRIORITY, SESSION_NOTICE, NODE_LOST_SECONDS,
)
"""What a user's kernel and server read (README: the kubernetes backend's environment variables)."""

# --- the hub -----------------------------------------------------------------------------------------------
HUB_CONFIG = _kernel("CONFIG", text, None, "path of the chart's configuration file (its ConfigMap, mounted); "
                                           "unset, the defaults")
HUB: tuple[Setting[Any], ...] = (HUB_CONFIG,)

# --- a donor's node labeller (the donor chart's DaemonSet sets them) -----------------------------------------
LABEL_INTERVAL = _kernel("LABEL_INTERVAL", seconds, 300.0, "Seconds between two passes of the node labeller.")
RUNTIME_CONFIG = _kernel("RUNTIME_CONFIG", text, None,
                         "The host's NVIDIA Container Toolkit config.toml as mounted in the labeller's pod; unset: "
                         "the toolkit's default path under the host mount.", "the toolkit's default path")
DEVICE_PLUGIN_CONFIG = _kernel("DEVICE_PLUGIN_CONFIG", text, None,
                              "NVIDIA's device plugin config (YAML) as mounted in the labeller's pod, for the GPU "
                              "sharing mode it reports (time-slicing or MPS replicas); unset: read from the node's "
                              "resources only (MIG, a memory isolator).", "the node's resources only")
DONOR: tuple[Setting[Any], ...] = (LABEL_INTERVAL, RUNTIME_CONFIG, DEVICE_PLUGIN_CONFIG)
"""What the donor chart's node labeller reads."""


# --- Metaflow: METAFLOW_GPU_OFFLOAD_*, or the same key in Metaflow's config file ----------------------------
def _flow(name: str, parse: Callable[[str], T], default: T, doc: str, shown: str = "") -> Setting[T]:
    return Setting("METAFLOW_GPU_OFFLOAD_" + name, parse, default, doc, shown)


FLOW_SOURCE = _flow("PLACEMENT_SOURCE", choice("auto", "live", "config"), "auto",
                    "`live`: ask the cluster (kubeconfig or in-cluster account), fail if it does not answer; "
                    "`config`: never ask; `auto`: ask when a kubeconfig exists, else fall back (a hub's spawner sets "
                    "`config`: a user's server may not read nodes)")
FLOW_INVENTORY = _flow("INVENTORY", text, None, "JSON file of clusters and GPUs, for checks without a cluster"
                                                " (format in `flows/inventory_file.py`)")
FLOW_CLUSTER = _flow("CLUSTER", text, None, "cluster used when a step says `cluster=\"auto\"`")
FLOW_POLICY = _flow("PLACEMENT_POLICY", choice(*POLICY_NAMES), "most-free", "placement policy for steps: "
                                                                            "`most-free`, `bin-pack` or "
                                                                            "`first-fit`")
FLOW_GPU_MODEL = _flow("GPU_MODEL", text, None, "model used when a step names none")
FLOW_NAMESPACE = _flow("NAMESPACE", text, None, "offloaded namespace for the step pods (`run` only: Argo runs"
                                                " every step in `METAFLOW_KUBERNETES_NAMESPACE`, so set that "
                                                "one to an offloaded namespace)", "Metaflow's")
FLOW_BACKEND = _flow("BACKEND", choice("kubernetes", "local"), "kubernetes",
                     "`local` leaves the steps as written: they run in the local process (CPU without a GPU)")
FLOW_QUEUE = _flow("QUEUE", text, None,
                   "Kueue LocalQueue the step Jobs wait in; unset, the one a hub's spawner set for the user's"
                   " server (`GPU_OFFLOAD_QUEUE`), else the one LocalQueue of the step pods' namespace (when "
                   "placement asks the cluster), else no queueing",
                   "`GPU_OFFLOAD_QUEUE`")
FLOW_PRIORITY = _flow("PRIORITY", text, None,
                      "Kueue priority class of steps that give no `priority=`; unset, the hub's default "
                      "(`GPU_OFFLOAD_PRIORITY`)",
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
GPU_SHARING = _kernel("GPU_SHARING", text, None, "A runner holding part of a GPU: the donor's sharing mode "
                      "(docs/sharing.md; the runner spells it itself, a test keeps both equal).")
GPU_ISOLATION = _kernel("GPU_ISOLATION", text, None, "A runner holding part of a GPU: the isolation its pod gets "
                        "(none, memory, compute and memory).")
GPU_MEMORY_LIMIT = _kernel("GPU_MEMORY_LIMIT", text, None, "A runner holding part of a GPU: the bytes of GPU memory "
                           "it caps its own use at.")
GPU_FRACTION = _kernel("GPU_FRACTION", text, None, "A runner holding part of a GPU: the share of the GPU it caps "
                       "its own use at when no byte figure is known.")
INTERNAL: tuple[Setting[Any], ...] = (RECORDED_PLACEMENT, BUNDLE_URL, OUTPUT_FORMAT, GPU_SHARING, GPU_ISOLATION,
                                      GPU_MEMORY_LIMIT, GPU_FRACTION)

ALL: tuple[Setting[Any], ...] = (*KERNEL, *HUB, *DONOR, *FLOW, *INTERNAL)


def assignments(values: Mapping[Setting[Any], object]) -> dict[str, str]:
    """Variables to set for another process: each setting's name and its value as text; None is left out."""
    out: dict[str, str] = {}
    for setting, value in values.items():
        if value is None or value == "":
            continue
        out[setting.name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out
