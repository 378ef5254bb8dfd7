"""The backend interface: how the engine starts runners and reads their events, whatever runs them.

The local backend runs the runner as a subprocess; a cluster backend runs it in a pod. Both hand the engine
the same stream of decoded frames, so the engine never knows which one it follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

from ...runner.frames import Event
from ..timing import Phase, Stopwatch

if TYPE_CHECKING:  # the local backend needs no cluster code loaded
    from ...liqo_peering.inventory import Inventory


@dataclass(frozen=True)
class RunnerExit:
    """The runner process ended; the last event of a one-shot run, or of a session whose runner died."""

    code: int | None
    """Exit code (negative: killed by that signal); ``None`` if unknown."""
    detail: str = ""
    """The runner's last diagnostics (stderr lines, stray output), for the error message."""


@dataclass(frozen=True)
class Placed:
    """Where the runner landed, once the cluster bound it (a cluster backend's pod on a virtual node)."""

    text: str
    """One line the notebook shows under the cell, e.g. ``running in pod p on virtual node n (...)``."""
    cluster: str = ""
    """The cluster id it landed on, when known (a queued run learns it only then)."""


@dataclass(frozen=True)
class Queued:
    """The run waits in a queue (Kueue) before it may start, or (``waiting`` False) it just left it."""

    text: str
    """One line the notebook shows, e.g. ``queued for 2 x A100: 4th of 9 in line; waiting 1 min 12 s``."""
    waiting: bool = True


@dataclass(frozen=True)
class Relaunched:
    """The backend deleted the run's runners before any of them showed anything of the cell and launched the
    run again elsewhere (a cluster backend's one retry): every rank starts anew."""

    text: str
    """One line the notebook shows as a warning: what failed, what was deleted, where the run goes now."""


RunEvent = Event | RunnerExit | Placed | Queued | Relaunched | Phase
"""What :meth:`Run.next_event` yields: a decoded frame (``docs/runner-protocol.md``), where the runner
landed, its place in a queue, that it was launched again elsewhere, the end of a launch phase, or the
runner's exit."""


def stale_frames_note(session: str, dropped: int) -> str:
    """What a session's run tells the user when frames of an earlier run of the session were dropped."""
    return (
        f"session `{session}`: {dropped} frame(s) of an earlier cell, which was not followed to its end, "
        "arrived during this cell and were dropped (they are not this cell's output)"
    )


@dataclass(frozen=True)
class Ranks:
    """The shape of a distributed run (``--nodes``): ``nodes`` nodes (pods) of ``procs_per_node`` rank
    processes each, started as ``torchrun`` starts its workers (``docs/distributed.md``)."""

    nodes: int
    procs_per_node: int
    out_rank: int = 0
    """The rank whose variables come back."""
    rendezvous_timeout: float = 300.0
    """Seconds from the first rank's start within which every rank must have started."""
    spread: bool = False
    """The nodes may span donors (cluster backends; refused with queueing on)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def bundle_field(self) -> dict[str, int]:
        """The bundle's ``ranks`` field: what every node's launcher needs to know of the shape."""
        return {"nodes": self.nodes, "procs_per_node": self.procs_per_node, "out_rank": self.out_rank}


@dataclass(frozen=True, kw_only=True)
class RunAsks:
    """What a run asks for, whichever front end wrote it: the fields a cell's request
    (:class:`~gpu_offload.engine.request.OffloadRequest`) and what the backend is asked
    (:class:`RunRequest`) share, so each is described and defaulted once."""

    gpus: int = 1
    """How many GPUs the runner may see; 0 runs on CPU (per node for a distributed run)."""
    fraction: float | None = None
    """``--gpus 0.5``: the part of one GPU asked for (``gpus`` is then 1); ``None``: whole GPUs."""
    gpu_memory: int | None = None
    """``--gpu-memory 12Gi`` in bytes: part of one GPU sized by memory; with ``fraction``, the larger need wins."""
    gpu_model: str | None = None
    """A GPU model to ask for (e.g. ``A100``); only placement on a cluster uses it."""
    fallback_models: tuple[str, ...] = ()
    """Models to take, in order, when ``gpu_model`` has no room (``--gpu-model A100,H100``)."""
    cluster: str = "auto"
    """A remote cluster id, or ``auto`` to let placement choose; only cluster backends use it."""
    image: str | None = None
    """Container image for a cluster backend; the local backend runs this kernel's Python."""
    timeout: float | None = None
    """``--timeout`` in seconds: the engine interrupts the cell after it, and a cluster backend bounds its pod
    with it; ``None`` waits forever."""
    priority: str | None = None
    """A Kueue priority class (``--priority``), used by a cluster backend with queueing on; ``None``: the
    configured default."""
    trusted_only: bool = False
    """``--trusted-only``: place on clusters the origin trusts only (a donor sees a cell's code and inputs)."""
    rerun_on_preemption: bool = False
    """``--rerun-on-preemption``: a one-shot run preempted before it finished is rerun once even after it printed."""
    idle_timeout: float | None = None
    """``--idle-timeout`` (given in minutes) in seconds: a session's runner is released after this long idle (a
    cluster backend's sessions; never longer than the hub's own timeout)."""

    def asks(self) -> dict[str, Any]:
        """These fields alone, to build another record of the same asks from."""
        return {name: getattr(self, name) for name in _ASKS}


_ASKS = tuple(f.name for f in fields(RunAsks))


@dataclass(frozen=True, kw_only=True)
class RunRequest(RunAsks):
    """Where and with what a runner starts: what a cell asks of a backend (``liqo_peering.placement`` turns
    a cluster backend's into a :class:`~gpu_offload.liqo_peering.placement.Placement` on a virtual node)."""

    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the runner."""
    ranks: Ranks | None = None
    """A distributed run's shape (``--nodes``); ``None`` for one runner. ``gpus`` is then per node."""

    def session_key(self) -> tuple[RunRequest, tuple[int, int] | None]:
        """What a session's runners are started with: its cells must ask for the same (a distributed
        session's cells may each choose their out rank and how output shows)."""
        ranks = self.ranks
        return replace(self, ranks=None, rerun_on_preemption=False, idle_timeout=None), (None if ranks is None else (ranks.nodes, ranks.procs_per_node))

    def shape(self) -> str:
        """The options that fix a runner's shape, as a cell writes them."""
        ranks = self.ranks
        if ranks is None:
            memory = f" --gpu-memory {self.gpu_memory // 2**20}Mi" if self.gpu_memory else ""
            return f"--gpus {self.fraction if self.fraction is not None else self.gpus:g}{memory}"
        return f"--gpus {self.gpus} --nodes {ranks.nodes} --procs-per-node {ranks.procs_per_node}"


@dataclass(frozen=True)
class Job:
    """One bundle to run, with what it asks for: the one thing that travels from the cell to the backend."""

    run_id: str
    nonce: str
    """The bundle's frame nonce (the backend decodes frames with it)."""
    bundle: bytes
    """The pickled bundle dict of the runner contract."""
    request: RunRequest = field(default_factory=RunRequest)
    """Where and with what its runner starts."""
    session: str | None = None
    """The warm runner to run it in (started on first use); ``None`` for a runner of its own."""
    clock: Stopwatch | None = field(default=None, compare=False, repr=False)
    """The run's phase marks from Shift-Enter (:mod:`..timing`), kept on its record when it ends."""
    preimport: tuple[str, ...] = ()
    """Modules a runner of its own imports while the bundle is on its way (``engine.preimport``)."""


@dataclass(frozen=True)
class Transfer:
    """How one run's buffers travel between the kernel and its runner: each field is the bundle's field of the
    same name (``make_bundle`` takes them whole).

    The backend chooses it once per run, before the bundle is pickled, so the bundle is pickled once.
    """

    input_transport: str
    """``shm`` (same machine) or ``inline`` (in the bundle)."""
    output_transport: str
    """``shm`` (same machine), ``inline`` (in the frames) or ``url`` (uploaded to ``output_urls``)."""
    shm_dir: str | None = None
    """Directory on tmpfs for ``shm`` buffers."""
    output_urls: tuple[str, ...] = ()
    """Upload URLs for ``url`` outputs, in the order the runner uses them."""
    log_url: str = ""
    """Where the runner uploads the run's log at its end (a CLI run on a cluster with object storage)."""


@dataclass(frozen=True)
class SessionInfo:
    """A warm runner, as listed by ``%gpu_offload sessions``."""

    name: str
    where: str
    """Human-readable location, e.g. ``local pid 1234``."""
    runs: int
    """Cells run so far."""
    busy: bool
    """Whether a cell is running now."""
    release: str = ""
    """When the backend gives the runner back if it stays idle (a cluster's idle timeout), in words."""


@dataclass(frozen=True)
class UserRun:
    """A run of the backend's user as the backend itself sees it, whichever kernel or command started it
    (a cluster backend reads it from the run's runner pod): how the panel finds runs whose kernel is gone."""

    run_id: str
    backend: str
    """The backend's name (``kubernetes``)."""
    kernel: str
    """The kernel (or command) that started it, as the backend labelled it; ``?`` when unknown."""
    cluster: str
    gpus: int
    state: str
    """``scheduling``, ``running``, ``done`` or ``failed``."""
    detail: str
    started: float
    """Seconds since the epoch."""
    cli: bool = False
    """Started by ``gpu-offload run`` rather than a notebook."""


class UserRuns(Protocol):
    """The runs of one user a backend can see and stop beside the engine (the panel, the runs REST API)."""

    @property
    def where(self) -> str:
        """Where the runs are read, for a message (``runner pods in namespace alice``)."""
        ...

    def user_runs(self) -> list[UserRun]:
        """The user's runs, whichever process started them."""
        ...

    def cancel_run(self, run_id: str) -> list[str]:
        """Remove what run ``run_id`` holds (its runner pods), for a run no live process follows any more;
        returns what was removed, in words (``Pod alice/gpuo-1``)."""
        ...

    def sweep(self, server: str, live_kernels: Callable[[], Mapping[str, int | None]]) -> list[str]:
        """Remove what the kernels of Jupyter server ``server`` started that are no longer among
        ``live_kernels()`` (kernel id -> process id; a kernel restarted under a new process counts as dead);
        returns what was removed, in words. Blocking I/O: a server runs it off its event loop."""
        ...


class InventorySource(Protocol):
    """Where a backend reads donors and their free GPUs (a watch-fed cache or the hub service)."""

    def inventory(self, timeout: float = 10.0) -> Inventory:
        """The current inventory, waiting up to ``timeout`` seconds for a first one."""
        ...


class Run(Protocol):
    """One submitted bundle being executed."""

    @property
    def cluster(self) -> str:
        """Where the runner is: the cluster id placement chose, or ``local``."""
        ...

    def progress(self) -> str:
        """Phase, place and elapsed time for ``--noblock`` handles; ``""`` when the backend has nothing to add."""
        ...

    def next_event(self, timeout: float) -> RunEvent | None:
        """The next event, or ``None`` if none arrives within ``timeout`` seconds.

        A one-shot run ends with :class:`RunnerExit`; a session run ends with a ``Done`` frame (or
        :class:`RunnerExit` if the session's runner died).
        """
        ...

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in the running cell (the runner survives if it is a session)."""
        ...

    def kill(self) -> None:
        """End the runner now (for a session this ends the session)."""
        ...

    def release(self, grace: float) -> int | None:
        """Free the run's resources once its events are read.

        A one-shot runner still running gets up to ``grace`` seconds to end (local: waited for; kubernetes:
        the pod's deletion grace period, its runner gets SIGTERM first), then is killed; returns its exit
        code when known. A session's runner stays up (returns ``None``; ``grace`` does not apply).
        """
        ...


class Backend(Protocol):
    """Starts runners. Implementations: ``local`` (subprocesses) and ``kubernetes`` (pods on Liqo virtual nodes)."""

    name: str

    def transfer(self, run_id: str) -> Transfer:
        """How the buffers of run ``run_id`` travel; asked once per run, before its bundle is made."""
        ...

    def describe(self) -> str:
        """One line for ``%gpu_offload status``."""
        ...

    def inventory(self) -> InventorySource | None:
        """The donors this backend places on (started on first use); ``None`` for a backend without a cluster."""
        ...

    def user_runs(self) -> UserRuns | None:
        """The runs of this backend's user it can see beside the engine, whichever kernel started them;
        ``None`` for a backend whose runs end with the process that started them (local)."""
        ...

    def trusts(self, cluster: str) -> bool:
        """Whether the origin trusts what a run on ``cluster`` (a :attr:`Run.cluster`) sends back, from the
        origin's configuration only (``liqo_peering.trust.run_trusted``): its outputs may be unpickled and
        its rich output shown as it is."""
        ...

    def submit(self, job: Job) -> Run:
        """Start running ``job`` in a new runner or in its session's."""
        ...

    def sessions(self) -> list[SessionInfo]:
        """The warm runners of this backend."""
        ...

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        """End the named session; ``False`` if there is none."""
        ...

    def close(self) -> None:
        """End every session (kernel shutdown)."""
        ...
