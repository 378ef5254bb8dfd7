"""An origin cluster with Liqo donors, in one piece: the part-2 plugin for the API server, and a context
manager for tests.

``LiqoOrigin(options).plugin`` (pass it to ``ApiServer(plugins=[...])``) serves the Liqo kinds, seeds the
donors, installs Liqo's webhooks and controllers, the scheduler and the test kubelet, and the fault
control endpoint. ``running_origin(workdir, donors=2)`` starts all of it in a background thread::

    with running_origin(tmp_path, donors=2, crds=LIQO_CRDS) as origin:
        core = kubernetes.client.CoreV1Api(origin.sandbox.api_client())
        origin.faults.node_not_ready("donor-1-gpu")   # from a test thread: origin.call(...)
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import hashlib
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..apiserver import fieldvalidation, incluster
from ..apiserver.api import Api
from ..controllers.scheduling import scheduler_controller
from ..faults import SandboxFaults
from ..kubelet import process
from ..kubelet.config import KubeletConfig
from ..kubelet.images import DEFAULT_MAP, Images
from ..kubelet.kubelet import Kubelet
from ..server import ApiServer, Plugin
from ..testing import RunningSandbox, running_sandbox
from . import controllers as liqo_controllers
from . import peering
from . import seed as liqo
from .labels import label_controller
from .reflection import DonorCopies, ReflectionTypes, reflection_controller
from .slices import slice_controller
from .virtualnodes import virtual_node_controller

atexit.register(process.kill_all)  # a sandbox killed by an exception still takes its processes along


@dataclass(frozen=True)
class OriginOptions:
    """What to emulate."""

    state_dir: Path
    """Pod folders and image runtimes go here."""
    donors: tuple[liqo.Donor, ...] = ()
    image_map: tuple[tuple[str, str], ...] = DEFAULT_MAP
    """(fnmatch pattern, ``project`` | ``stock`` | interpreter path), first match wins."""
    backoff: float = 0.5
    """First restart/pull back-off in seconds (a kubelet's is 10 s; short here so tests do not wait)."""
    max_backoff: float = 5.0
    """Back-off ceiling (a kubelet's is 300 s)."""
    tool_dirs: tuple[Path, ...] = ()
    """Folders searched after PATH for tools hub images carry (configurable-http-proxy)."""
    field_validation: str = "Strict"
    """``fieldValidation`` of requests without one (``fieldvalidation.py``). Strict here, for the project's
    tests: a manifest the project builds with a misspelt field fails its test instead of losing the field
    with a warning nobody reads. The CLI passes Warn, kube-apiserver's default, for outside clients."""
    isolate: bool = True
    """As root: pods in network namespaces, containers in PID namespaces as their user (KubeletConfig)."""
    in_cluster_api: bool = False
    """Where pods have their own network: serve the API over TLS on the pod network's gateway and give
    containers in-cluster configuration (``incluster.py``), so a program in a pod finds the API as on a
    cluster (KubeSpawner's user servers in ``gpu-offload lab --hub``). Off by default: containers then get
    only what their spec gives, which the kubelet tests compare exactly."""
    reflection: ReflectionTypes = ReflectionTypes()
    """The origin's Liqo reflector types for Secrets and ConfigMaps (Liqo's default: DenyList for both)."""


@dataclass
class LiqoOrigin:
    """The part-2 pieces of one sandbox; ``plugin`` wires them into an ``ApiServer``."""

    options: OriginOptions
    images: Images = field(init=False)
    kubelet: Kubelet = field(init=False)
    faults: SandboxFaults = field(init=False)
    copies: DonorCopies = field(init=False)
    """What Liqo reflected to each donor (``reflection.py``)."""
    donors: dict[str, liqo.Donor] = field(default_factory=dict)
    """The donors peered now, by cluster id: seeded ones and those peered at run time (``peering.py``)."""
    server: ApiServer | None = None

    def plugin(self, server: ApiServer) -> None:
        """Install Liqo, the scheduler, the kubelet and the faults on ``server`` (before it starts)."""
        self.server = server
        api = server.api
        opts = self.options
        if opts.field_validation not in fieldvalidation.MODES:
            raise ValueError(f"field_validation={opts.field_validation!r}: use one of {', '.join(fieldvalidation.MODES)}")
        api.field_validation = opts.field_validation
        liqo_controllers.ensure_crds(api)
        liqo_controllers.seed(api, opts.donors)
        liqo_controllers.install_admission(api)
        self.images = Images(opts.state_dir, opts.image_map, tool_dirs=opts.tool_dirs)
        self.copies = DonorCopies(opts.reflection)
        self.kubelet = Kubelet(api, self.images, KubeletConfig(opts.state_dir, opts.backoff, opts.max_backoff,
                                                                   opts.isolate),
                               gate=liqo_controllers.offloading_gate(api), names=liqo_controllers.donor_names(api),
                               donor_lookup=self.copies.lookup(api))
        self.faults = SandboxFaults(api, self.kubelet, self.images)
        gateway = self.kubelet.network.gateway
        if opts.in_cluster_api and gateway is not None:
            endpoint = incluster.bind(gateway, opts.state_dir)
            server.serve_socket(endpoint.sock, endpoint.ssl_context())
            self.kubelet.in_cluster = endpoint
        self.faults.routes(server.app)
        self.donors.update((d.cluster_id, d) for d in opts.donors)

        async def slices(api: Api) -> None:
            await slice_controller(api, self.donors)

        async def kubelet(api: Api) -> None:
            self.kubelet.start()
            try:
                await asyncio.Event().wait()
            finally:
                await self.kubelet.shutdown()

        async def reflection(api: Api) -> None:
            await reflection_controller(api, self.copies)

        for controller in (liqo_controllers.offloading_controller, reflection, slices, virtual_node_controller,
                           label_controller, scheduler_controller, kubelet):
            server.add_controller(controller)

    def call(self, coro: Any, timeout: float | None = 60) -> Any:
        """Run a coroutine (e.g. ``faults.node_not_ready(...)``) on the server's loop from a test thread."""
        if self.server is None:
            raise RuntimeError("the origin is not installed on a server yet: pass .plugin to ApiServer first")
        return self.server.call(coro, timeout)


@dataclass(frozen=True)
class RunningOrigin:
    """A started origin: the part-1 sandbox handle plus the Liqo pieces."""

    sandbox: RunningSandbox
    origin: LiqoOrigin

    @property
    def faults(self) -> SandboxFaults:
        return self.origin.faults

    @property
    def kubelet(self) -> Kubelet:
        return self.origin.kubelet

    @property
    def donor_copies(self) -> DonorCopies:
        """What Liqo reflected to each donor: what a donor holds of the origin's Secrets and ConfigMaps."""
        return self.origin.copies

    @property
    def host_address(self) -> str:
        """Where a server beside the sandbox (an object store outside the cluster) listens so that both this
        machine and the pods reach it: the pod network's bridge when pods have their own network namespaces
        (the host's 127.0.0.1 is not theirs), else 127.0.0.1."""
        return self.kubelet.network.gateway or "127.0.0.1"

    def call(self, coro: Any, timeout: float | None = 60) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return self.origin.call(coro, timeout)

    def peer(self, donors: Sequence[liqo.Donor]) -> None:
        """Peer ``donors`` into the running origin, as ``liqoctl peer`` does (``peering.py``)."""
        api = self.sandbox.api

        async def run() -> None:
            peering.peer(api, donors, self.origin.donors)
        self.call(run())

    def unpeer(self, cluster_ids: Sequence[str], timeout: float = peering.UNPEER_TIMEOUT) -> None:
        """Unpeer these clusters, as ``liqoctl unpeer`` does: returns once their virtual nodes (and the pods on
        them), slices, ForeignClusters and tenant namespaces are gone (``peering.py``)."""
        self.call(peering.unpeer(self.sandbox.api, cluster_ids, self.origin.donors, self.origin.copies, timeout),
                  timeout + 30)

    def peered(self) -> list[str]:
        """The cluster ids peered now."""
        api = self.sandbox.api

        async def run() -> list[str]:
            return peering.peered(api)
        return list(self.call(run()))

    def live_processes(self) -> list[int]:
        """Pids of the processes this origin's pods started that are still alive: none once it stopped
        (another sandbox running beside it in the same process keeps its own)."""
        return process.live_processes(self.kubelet.process_owner)


def describe(donor_list: Sequence[liqo.Donor], crds: Path | Sequence[Path] | None, plugins: Sequence[Plugin],
             options: dict[str, Any]) -> str:
    """One line naming an origin's configuration: its donors, CRD folders, plugins and the options it sets."""
    def donor(d: liqo.Donor) -> str:
        shared = "" if d.sharing == "none" else f" {d.sharing}"
        return f"{d.cluster_id} {d.gpus}x{d.gpu_model or '?'}{shared}"
    folders = [crds] if isinstance(crds, Path | str) else list(crds or ())
    parts = [", ".join(donor(d) for d in donor_list) or "no donors",
             "crds: " + (" ".join(Path(f).name for f in folders) or "built-in")]
    parts += [_plugin(p) for p in plugins]
    # an option's value by a short digest: two origins with equal digests were configured alike
    parts += [f"{key}#{hashlib.sha256(repr(options[key]).encode()).hexdigest()[:6]}" for key in sorted(options)]
    return "; ".join(parts)


def _plugin(plugin: Plugin) -> str:
    """``+Kueue(usage_sampling=36000.0)``: a plugin's owner and the options it changed from their defaults."""
    owner = getattr(plugin, "__self__", plugin)
    name = getattr(owner, "__name__", type(owner).__name__)
    options: Any = getattr(owner, "options", None)
    if options is None or not dataclasses.is_dataclass(options):
        return f"+{name}"
    cls: Any = type(options)
    default = cls()
    changed = [f"{f.name}={getattr(options, f.name)!r}" for f in dataclasses.fields(options)
               if getattr(options, f.name) != getattr(default, f.name)]
    return f"+{name}({', '.join(changed)})"


@contextmanager
def running_origin(workdir: Path, donors: int | Sequence[liqo.Donor] = 2, gpus: int = 4, gpu_model: str = "A100",
                   crds: Path | Sequence[Path] | None = None, plugins: Sequence[Plugin] = (),
                   **options: Any) -> Iterator[RunningOrigin]:
    """An origin with ``donors`` Liqo donors served from a background thread for the ``with`` block.

    ``plugins`` go after the origin's own (Kueue's needs its scheduler). On exit the server stops, the kubelet
    kills every container process, and none is left running.
    """
    donor_list = liqo.donors(donors, gpus, gpu_model) if isinstance(donors, int) else tuple(donors)
    # counted, and listed by configuration, by the test suite's session check
    sys.audit("gpu_offload.sandbox.origin", len(donor_list), describe(donor_list, crds, plugins, options))
    origin = LiqoOrigin(OriginOptions(workdir / "state", donor_list, **options))
    with running_sandbox(workdir, crds=crds, plugins=[origin.plugin, *plugins]) as sandbox:
        yield RunningOrigin(sandbox, origin)
