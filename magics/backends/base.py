"""The backend interface: how the engine starts runners and reads their events, whatever runs them.

The local backend runs the runner as a subprocess; a cluster backend runs it in a pod. Both hand the engine
the same stream of decoded frames, so the engine never knows which one it follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..runner.frames import Event


@dataclass(frozen=True)
class RunnerExit:
    """The runner process ended; the last event of a one-shot run, or of a session whose runner died."""

    code: int | None
    """Exit code (negative: killed by that signal); ``None`` if unknown."""
    detail: str = ""
    """The runner's last diagnostics (stderr lines, stray output), for the error message."""


RunEvent = Event | RunnerExit
"""What :meth:`Run.next_event` yields: a decoded frame (``docs/runner-protocol.md``) or the runner's exit."""


@dataclass(frozen=True)
class Job:
    """One bundle to run."""

    run_id: str
    nonce: str
    """The bundle's frame nonce (the backend decodes frames with it)."""
    bundle: bytes
    """The pickled bundle dict of the runner contract."""


@dataclass(frozen=True)
class Placement:
    """Where and with what a runner starts."""

    gpus: int = 1
    """Number of GPUs the runner may see."""
    gpu_model: str | None = None
    """A GPU model to ask for; only cluster backends use it."""
    cluster: str = "auto"
    """A remote cluster id or ``auto``; only cluster backends use it."""
    image: str | None = None
    """Container image; only cluster backends use it."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the runner."""
    timeout: float | None = None
    """``--timeout`` in seconds; a cluster backend bounds its pod with it (the engine interrupts first)."""


@dataclass(frozen=True)
class Transfer:
    """How buffers travel between the kernel and this backend's runners (fields of the bundle)."""

    output_transport: str
    """``shm`` (same machine), ``inline`` or ``url``."""
    shm_dir: str | None = None
    """Directory on tmpfs for ``shm`` buffers."""


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


class Run(Protocol):
    """One submitted bundle being executed."""

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

        A one-shot runner is waited for up to ``grace`` seconds, then killed; returns its exit code.
        A session's runner stays up (returns ``None``).
        """
        ...


class Backend(Protocol):
    """Starts runners. Implementations: ``local`` (subprocess); cluster backends come later."""

    name: str
    transfer: Transfer

    def describe(self) -> str:
        """One line for ``%gpu_offload status``."""
        ...

    def submit(self, job: Job, placement: Placement, session: str | None = None) -> Run:
        """Start running ``job`` in a new runner or in the named session."""
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
