"""Who learns what about a run besides the cell that follows it: listeners subscribed to the engine's
run events, and the cancel handle every run is started with.

The engine publishes; it never asks a listener anything back. A listener (the kernel's run book for the
panel, a shell command's) reads what it needs from the notes and stops a run only through the run's
:class:`CancelHandle`, which the follower checks on every poll: nothing outside the follower raises in it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .backends.base import Job, RunEvent


class CancelHandle:
    """Cancel requests for one run, from any thread: the first interrupts the cell as Ctrl-C would (output
    kept, nothing copied back), a second kills the runner without waiting out the grace period."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._presses = 0
        self.requested = threading.Event()
        """Set at the first request (a ``--noblock`` handle waits on it)."""

    def cancel(self) -> None:
        """Ask for the run to stop (again: stop now)."""
        with self._lock:
            self._presses += 1
        self.requested.set()

    @property
    def presses(self) -> int:
        """How many times :meth:`cancel` was called."""
        with self._lock:
            return self._presses


@dataclass(frozen=True)
class RunStarted:
    """A run the backend accepted."""

    job: Job
    backend: str
    """The backend's name (``local``, ``kubernetes``)."""
    cluster: str
    """Where the backend put it (``auto`` resolved), as :attr:`Run.cluster` said at submission."""
    cancel: CancelHandle
    """How a listener stops it."""


class RunListener(Protocol):
    """What a subscriber to :class:`RunEvents` is told, in this order for each run: ``submitting``, then
    ``not_started`` (nothing runs), or ``started``, every ``event`` and ``waiting``, and ``ended`` once the run's
    resources are released. Calls come from the thread that follows the run; they must return quickly."""

    def submitting(self, job: Job, backend: str) -> None:
        """``job`` is about to be handed to ``backend``."""
        ...

    def not_started(self, job: Job, error: BaseException) -> None:
        """The backend did not start ``job`` (``error`` says why)."""
        ...

    def started(self, run: RunStarted) -> None:
        """The backend started it."""
        ...

    def event(self, run_id: str, event: RunEvent) -> None:
        """One event of the run, as the engine received it."""
        ...

    def waiting(self, run_id: str) -> None:
        """The follower polled and no event came (several times a second while a run is quiet)."""
        ...

    def ended(self, run_id: str) -> None:
        """The run's resources were released; no more notes about it follow."""
        ...


class RunEvents:
    """The engine's one subscription point: every listener subscribed hears about every run started through
    it. A listener that raises is not the run's problem: the error is kept in :attr:`errors` and the
    run goes on."""

    def __init__(self) -> None:
        self._listeners: tuple[RunListener, ...] = ()
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []
        """What listeners raised (a listener must not break a run; this is where its failure is seen)."""

    def subscribe(self, listener: RunListener) -> Callable[[], None]:
        """Tell ``listener`` about every run from now on; returns the call that unsubscribes it."""
        with self._lock:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(x for x in self._listeners if x is not listener)

        return unsubscribe

    def _tell(self, call: Callable[[RunListener], None]) -> None:
        for listener in self._listeners:  # a tuple swapped whole: no lock on the hot path
            try:
                call(listener)
            except Exception as exc:  # noqa: BLE001 - a listener's bug must not stop or lose the cell
                self.errors.append(exc)

    def submitting(self, job: Job, backend: str) -> None:
        self._tell(lambda x: x.submitting(job, backend))

    def not_started(self, job: Job, error: BaseException) -> None:
        self._tell(lambda x: x.not_started(job, error))

    def started(self, run: RunStarted) -> None:
        self._tell(lambda x: x.started(run))

    # the two calls of every poll: a plain loop, no closure per call
    def event(self, run_id: str, event: RunEvent) -> None:
        for listener in self._listeners:
            try:
                listener.event(run_id, event)
            except Exception as exc:  # noqa: BLE001 - as in _tell
                self.errors.append(exc)

    def waiting(self, run_id: str) -> None:
        for listener in self._listeners:
            try:
                listener.waiting(run_id)
            except Exception as exc:  # noqa: BLE001 - as in _tell
                self.errors.append(exc)

    def ended(self, run_id: str) -> None:
        self._tell(lambda x: x.ended(run_id))


@dataclass(frozen=True)
class Watch:
    """What :func:`~gpu_offload.engine.engine.follow` needs to publish one run and obey its cancel handle."""

    run_id: str
    cancel: CancelHandle
    events: RunEvents
