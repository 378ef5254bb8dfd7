"""One offloaded cell from request to result: launch, follow (blocking or in the background), conclude.

Every run is started with a cancel handle and published to the listeners of the front end's
:class:`~.observing.RunEvents` (the run book the panel reads), from submission to release.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..liqo_peering.sharing import RUNNER_FRACTION, RUNNER_MEMORY_LIMIT
from ..runner import buffers
from .analysis import CellAnalysis
from .backends.base import Backend, Run, RunRequest
from .bundle import build_job
from .engine import FollowSettings, Intake, Outcome, conclude, discard_outputs, follow
from .errors import OffloadError, OffloadUsageError
from .observing import CancelHandle, RunEvents, RunStarted, Watch
from .ranked import RankedRun
from .request import OffloadRequest
from .sinks import RecordingSink, Sink
from .timing import Stopwatch
from .trust.intake import Wanted


@dataclass(frozen=True)
class Launch:
    """What a cell needs besides the request: its analysis and where it shows up in tracebacks."""

    analysis: CellAnalysis
    filename: str = "<offloaded cell>"
    first_line: int = 2
    """Notebook line of the cell body (below the ``%%gpu_offload`` line), so tracebacks match the cell."""
    script: Mapping[str, Any] | None = None
    """Run the cell's text as a script (``gpu-offload run``): the bundle's ``script`` field."""
    clock: Stopwatch | None = field(default=None, compare=False, repr=False)
    """Started at Shift-Enter (the magic marks ``analysis``); the engine marks the rest."""


def intake(backend: Backend, launch: Launch) -> Intake:
    """What the kernel accepts back from this cell's run: trust from the backend's (origin-side) settings."""
    analysis = launch.analysis
    return Intake(backend.trusts,
                  Wanted(tuple(analysis.outputs), tuple(analysis.required_outputs), dict(analysis.imports)))


RANKS_BACKENDS = frozenset({"local", "kubernetes"})
"""Backends that run distributed runs (``--nodes``): local processes, or an Indexed Job's pods
(``docs/distributed.md``)."""


def share_env(request: OffloadRequest) -> dict[str, str]:
    """What a runner holding part of a GPU caps itself at (a cluster's placement may refine it)."""
    env = {}
    if request.fraction is not None:
        env[RUNNER_FRACTION] = format(request.fraction, "g")
    if request.gpu_memory is not None:
        env[RUNNER_MEMORY_LIMIT] = str(request.gpu_memory)
    return env


def run_request(request: OffloadRequest) -> RunRequest:
    """What a cell's request asks of the backend: its asks, the share a runner caps itself at, its ranks."""
    return RunRequest(**request.asks(), env=share_env(request), ranks=request.ranks)


@dataclass(frozen=True)
class Started:
    """A submitted run, with what stops it and where it is published."""

    run: Run
    refs: tuple[dict[str, Any], ...]
    """The inputs' shared-memory buffers, discarded once the run is released."""
    watch: Watch
    """Its id, its cancel handle and the listeners told about it."""

    @property
    def cancel(self) -> CancelHandle:
        """The run's cancel handle."""
        return self.watch.cancel

    def release(self, grace: float) -> None:
        """Free the run's resources and buffers, then tell the listeners it ended."""
        try:
            self.run.release(grace)
        finally:
            buffers.discard(self.refs)
            self.watch.events.ended(self.watch.run_id)


def start(
    request: OffloadRequest, launch: Launch, namespace: MutableMapping[str, Any], backend: Backend,
    grace: float = 5.0, events: RunEvents | None = None,
) -> Started:
    """Pickle the inputs and submit; nothing is left behind if either step fails. ``grace``: how long a
    distributed session's ranks get to stop after one of them failed (:class:`RankedRun`). ``events``: who is
    told about the run (nobody by default)."""
    ranks = request.ranks
    if ranks is not None and backend.name not in RANKS_BACKENDS:
        raise OffloadUsageError(
            f"--nodes: the {backend.name} backend cannot run distributed cells yet; run it on the local backend "
            "(--backend local) to try the DDP code, or leave out the distributed options."
        )
    job, refs = build_job(
        request.cell,
        launch.analysis,
        namespace,
        backend.transfer,
        filename=launch.filename,
        first_line=launch.first_line,
        request=run_request(request),
        session=request.session,
        script=launch.script,
    )
    clock = launch.clock
    if clock is not None:
        clock.mark("bundle")
        job = replace(job, clock=clock)
    events = events or RunEvents()
    events.submitting(job, backend.name)
    try:
        run: Run = backend.submit(job)
        if clock is not None:
            clock.mark("submitted")
    except BaseException as exc:
        buffers.discard(refs)
        events.not_started(job, exc)
        raise
    watch = Watch(job.run_id, CancelHandle(), events)
    events.started(RunStarted(job, backend.name, run.cluster, watch.cancel))
    if ranks is not None:
        run = RankedRun(run, ranks, request.show, settle=grace if request.session is not None else None)
    return Started(run, refs, watch)


def run_blocking(
    request: OffloadRequest,
    launch: Launch,
    namespace: MutableMapping[str, Any],
    backend: Backend,
    sink: Sink,
    settings: FollowSettings,
    record: Callable[[Outcome], None] | None = None,
    events: RunEvents | None = None,
) -> Outcome:
    """Run the cell and follow it here; outputs enter ``namespace`` only if it succeeded.

    ``record`` sees the outcome before its error (if any) is raised, e.g. for ``%gpu_offload status``.
    ``events``: who is told about the run; a listener stops it through its cancel handle.
    """
    started = start(request, launch, namespace, backend, settings.grace, events)
    try:
        outcome = follow(started.run, sink, settings, intake(backend, launch), watch=started.watch,
                         clock=launch.clock)
    finally:
        started.release(settings.grace)
    if record is not None:
        record(outcome)
    conclude(outcome, namespace, sink)
    return outcome


class OffloadHandle:
    """A ``--noblock`` run: ``.status``, ``.result()``, ``.cancel()``.

    Output is kept until :meth:`result` shows it; outputs enter the namespace when :meth:`result` is
    called on a successful run.
    """

    def __init__(
        self,
        request: OffloadRequest,
        launch: Launch,
        namespace: MutableMapping[str, Any],
        backend: Backend,
        settings: FollowSettings,
        sink: Sink,
        events: RunEvents | None = None,
    ) -> None:
        self.request = request
        self._namespace = namespace
        self._sink = sink
        self._recording = RecordingSink()
        self._outcome: Outcome | None = None
        self._concluded = False
        self._started = start(request, launch, namespace, backend, settings.grace, events)
        self._run = self._started.run
        self.run_id = self._started.watch.run_id
        """The run's id, as the panel and ``gpu-offload runs`` list it."""
        self._settings = settings
        self._intake = intake(backend, launch)
        self._clock = launch.clock
        self._thread = threading.Thread(target=self._follow, daemon=True, name="gpu-offload-noblock")
        self._thread.start()

    def _follow(self) -> None:
        try:
            self._outcome = follow(self._run, self._recording, self._settings, self._intake,
                                   watch=self._started.watch, clock=self._clock)
        except BaseException as exc:  # a thread's exception would otherwise vanish; result() raises it
            failed = OffloadError(f"Following the --noblock run failed: {exc!r}. Run the cell again.")
            failed.__cause__ = exc
            self._outcome = Outcome(status="died", error=failed)
            self._run.kill()
        finally:
            self._started.release(self._settings.grace)

    @property
    def status(self) -> str:
        """``running``, then ``ok``, ``error``, ``interrupted``, ``cancelled``, ``timeout`` or ``died``."""
        if self._outcome is None:
            return "cancelling" if self._started.cancel.presses else "running"
        return self._outcome.status

    @property
    def progress(self) -> str:
        """What the run is doing while it runs (a cluster backend: its place in the queue, or phase and
        place); ``""`` once it ended."""
        return self._run.progress() if self._outcome is None else ""

    def done(self) -> bool:
        """Whether the run has ended."""
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end; returns :meth:`done`."""
        self._thread.join(timeout)
        return self.done()

    def cancel(self) -> None:
        """Interrupt the run (a one-shot runner is then killed after the grace period; cancel again to kill it
        at once); copies nothing back. The panel's cancel button presses the same handle."""
        self._started.cancel.cancel()

    def result(self) -> dict[str, Any]:
        """Wait, show the output, load the outputs into the notebook and return them (or raise the error).

        Ctrl-C while waiting cancels the run.
        """
        try:
            while not self.wait(0.1):
                self._recording.replay(self._sink)
        except KeyboardInterrupt:
            self.cancel()
            self.wait()
            raise
        finally:
            self._recording.replay(self._sink)
        outcome = self._outcome
        assert outcome is not None
        if self._concluded:
            raise RuntimeError(
                "This handle's result was already taken; its outputs are in the notebook namespace."
            )
        self._concluded = True
        if outcome.status == "cancelled":
            discard_outputs(outcome)
            raise KeyboardInterrupt("the --noblock run was cancelled; no variable was copied back")
        return conclude(outcome, self._namespace, self._sink)

    def __repr__(self) -> str:
        progress = self.progress  # cluster backends: place in the queue, or phase, place and time
        where = f" ({progress})" if progress else ""
        return f"<gpu_offload run {self.status}{where}: use .result(), .status or .cancel()>"
