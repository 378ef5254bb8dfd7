"""Follows a run's events and turns them into what the notebook shows and gets back.

Streams go out as they arrive; a remote error is raised as :class:`RemoteError` after the output before it;
outputs enter the user namespace only when the run succeeded, so a failed or interrupted run never
overwrites a variable. Ctrl-C (KeyboardInterrupt while following) interrupts the cell remotely, and so does
the run's cancel handle (:mod:`.observing`), which is how anything but the user's own Ctrl-C stops a run;
every event is published to the listeners of the run's :class:`~.observing.RunEvents` as it is read.

What a run on a cluster the origin does not trust sends is taken only through :mod:`.trust`: rich output
through the MIME allowlist, published untrusted; outputs only as a safe container, never a pickle, and
none of its buffer references acted on (not even to delete them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ..liqo_peering.untrusted_text import shown
from ..runner import buffers, frames
from .backends.base import Placed, Queued, Relaunched, Run, RunnerExit
from .errors import OffloadError, OffloadQueueTimeout, OffloadTimeout, RemoteError, RunnerDied
from .observing import Watch
from .sinks import Progress, Sink
from .timing import Phase, RunTiming, Stopwatch
from .trust.intake import Wanted, load_untrusted

POLL = 0.05


@dataclass(frozen=True)
class Intake:
    """What the kernel accepts from one run, decided on the origin from its own configuration only."""

    trusts: Callable[[str], bool]
    """Whether a cluster is trusted (the backend's ``trusts``). Asked with the run's cluster when rich output
    or outputs arrive: a run lost before it started may go on elsewhere, and its pod was told there."""
    wanted: Wanted = field(default_factory=Wanted)
    """The names asked for; an untrusted run's container is read for these only."""


TRUSTED = Intake(lambda _cluster: True)
"""For runs whose every byte comes from the user's own machine (tests replaying a local runner)."""
UNTRUSTING = Intake(lambda _cluster: False)


@dataclass(frozen=True)
class FollowSettings:
    """How patiently the engine follows a run."""

    progress_after: float = 2.0
    """Seconds without output before saying what the run waits for."""
    grace: float = 5.0
    """Seconds an interrupted runner gets to finish before it is killed."""
    timeout: float | None = None
    """``--timeout``: seconds after which the cell is interrupted (counted from when it left a queue)."""
    queue_timeout: float | None = None
    """``--queue-timeout``: seconds after which a run still waiting in a queue is withdrawn."""


@dataclass
class Outcome:
    """What following a run produced (mutable while following, read-only after)."""

    status: str = "running"
    """``running``, ``ok``, ``error``, ``interrupted``, ``cancelled``, ``timeout`` or ``died``."""
    error: OffloadError | None = None
    outputs: frames.Outputs | None = None
    hello: frames.Hello | None = None
    metrics: frames.Metrics | None = None
    elapsed: float = 0.0
    state: str = "starting runner"
    seen_output: bool = False
    remote_error: frames.Error | None = None
    queued: bool = False
    """The run waits in a queue (Kueue) now, as its last ``Queued`` event said."""
    intake: Intake = UNTRUSTING
    """What :func:`follow` was told to accept (an outcome made elsewhere trusts nothing)."""
    untrusted_from: str | None = None
    """The cluster the outputs came from when it is not trusted (``None``: trusted or no outputs)."""
    timing: RunTiming | None = None
    """Where the wait from Shift-Enter went, when the run was timed (:mod:`.timing`)."""
    gpu_peak: int | None = None
    """Bytes of GPU memory the cell's torch allocator held at most, as the runner reported (``None``: unknown)."""


class _Stop(Exception):
    def __init__(self, status: str) -> None:
        self.status = status


def follow(
    run: Run,
    sink: Sink,
    settings: FollowSettings,
    intake: Intake,
    *,
    watch: Watch | None = None,
    clock: Stopwatch | None = None,
) -> Outcome:
    """Read ``run``'s events into ``sink`` until it is done; KeyboardInterrupt interrupts it remotely.

    The KeyboardInterrupt is re-raised once the runner has stopped (output kept, nothing loaded). ``watch``:
    where the events are published, and the cancel handle that ends the run ``cancelled``. ``clock`` gets the
    marks of the phases the events end (:mod:`.timing`).
    """
    outcome = Outcome(intake=intake)
    started = time.monotonic()
    try:
        _read(run, sink, settings, outcome, started, watch, clock)
    except KeyboardInterrupt:
        _stop(run, sink, settings, outcome, "interrupted", watch)
        discard_outputs(outcome)
        raise
    except _Stop as stop:
        waited = outcome.state if outcome.queued else ""
        _stop(run, sink, settings, outcome, "timeout" if stop.status == "queue-timeout" else stop.status, watch)
        if stop.status == "queue-timeout" and settings.queue_timeout is not None:
            outcome.error = OffloadQueueTimeout(settings.queue_timeout, waited)
        elif stop.status == "timeout" and settings.timeout is not None:
            outcome.error = OffloadTimeout(settings.timeout)
    outcome.elapsed = time.monotonic() - started
    if clock is not None:
        outcome.timing = clock.record()
    return outcome


def _read(
    run: Run,
    sink: Sink,
    settings: FollowSettings,
    outcome: Outcome,
    started: float,
    watch: Watch | None,
    stopwatch: Stopwatch | None,
) -> None:
    quiet_since = started
    announced = ""
    clock = started  # what --timeout counts from: the start, or when the run left a queue
    while True:
        event = run.next_event(POLL)
        now = time.monotonic()
        if stopwatch is not None and event is not None:
            _time(stopwatch, event, now)
        if watch is not None:
            _publish(watch, event)
        if isinstance(event, Queued):
            # shown at once: a place in line is news; the quiet notice below would only repeat it
            outcome.state = announced = event.text
            outcome.queued = event.waiting
            quiet_since = clock = now
            sink.notice(Progress(event.text))
            event = None
        if event is not None:
            if isinstance(event, frames.Status) and not outcome.queued:
                # while in line the place in line says more than the pod's phase (``waiting for Kueue``), which
                # the follower may report after it
                outcome.state = event.state
                quiet_since = now
            if _handle(event, sink, outcome, run):
                if isinstance(event, frames.Done) and event.status == "interrupted":
                    _explain_interrupt(run, outcome, settings.grace)
                return
        if watch is not None and watch.cancel.presses:
            raise _Stop("cancelled")
        if outcome.queued:
            if settings.queue_timeout is not None and now - started > settings.queue_timeout:
                raise _Stop("queue-timeout")
        elif settings.timeout is not None and now - clock > settings.timeout:
            raise _Stop("timeout")
        quiet = event is None and not outcome.seen_output and now - quiet_since > settings.progress_after
        if quiet and announced != outcome.state:
            announced = outcome.state
            sink.notice(Progress(f"no output yet after {now - started:.0f} s: {outcome.state}"))


def _publish(watch: Watch, event: object) -> None:
    if event is None:
        watch.events.waiting(watch.run_id)
    else:
        watch.events.event(watch.run_id, event)  # type: ignore[arg-type]  # what next_event returned


def _time(clock: Stopwatch, event: object, now: float) -> None:
    """Mark the phase ``event`` ends (the first of each counts)."""
    if isinstance(event, Phase):
        clock.mark(event.name, event.at)
    elif isinstance(event, frames.Hello):
        clock.mark("runner start", now)
        clock.runner_boot = event.boot
    elif isinstance(event, frames.Status) and event.imports is not None and not clock.has("imports"):
        clock.mark("imports", now)
        clock.runner_imports = event.imports
    elif isinstance(event, (frames.Stream, frames.DisplayData)):
        clock.mark("first line", now)
    elif isinstance(event, (frames.Done, RunnerExit)):
        clock.mark("done", now)


def _explain_interrupt(run: Run, outcome: Outcome, grace: float) -> None:
    """An interrupt this engine did not send (ours end in :func:`_stop`): find out why, briefly.

    A backend may follow with the cause (a cluster backend reports a lost node as an error), or the
    runner exits; otherwise something outside sent the runner SIGINT/SIGTERM, or the cell raised it.
    """
    outcome.status = "died"
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        event = run.next_event(POLL)
        if isinstance(event, frames.Error) and event.ename != "KeyboardInterrupt":
            outcome.error = RemoteError(event.ename, event.evalue, event.traceback)
            return
        if isinstance(event, RunnerExit):
            outcome.error = RunnerDied(event.code, event.detail)
            return
    outcome.error = OffloadError(
        "The cell stopped with a KeyboardInterrupt this notebook did not send: the runner got SIGINT or "
        "SIGTERM from outside, or the cell raised it. Output so far is kept; no variable was copied back. "
        "Run the cell again."
    )


def _untrusted(run: Run, outcome: Outcome) -> str | None:
    """The run's cluster if the origin does not trust it."""
    cluster = run.cluster
    return None if outcome.intake.trusts(cluster) else cluster


def _display(data: Mapping[str, Any], metadata: Mapping[str, Any], sink: Sink, untrusted: str | None) -> None:
    if untrusted is None:
        sink.display(data, metadata)
        return
    from .trust.rich import safe_display  # nh3 loads only for a cluster that needs it

    shown = safe_display(data, metadata)
    # the front ends decide trust per notebook cell, not per output: the allowlist above is what protects;
    # the mark records where the output came from
    sink.display(shown.data, {**shown.metadata, "trusted": False})
    if shown.dropped:
        sink.notice(f"output types {', '.join(shown.dropped)} from {untrusted} (a cluster this notebook does not "
                    "trust) were not shown: only plain text, images, JSON and sanitised HTML, SVG or Markdown are")


def _take_outputs(event: frames.Outputs, outcome: Outcome, run: Run) -> None:
    outcome.outputs = event
    outcome.untrusted_from = _untrusted(run, outcome)


SIGNAL_SHOWN = 20
"""At most this many characters of the signal's name a runner sends (a donor's words) reach the notebook."""


def stopping_notice(event: frames.Stopping) -> str:
    """The line a running cell shows the moment its runner gets SIGTERM (its pod is being deleted), in the
    kernel's words; the runner's ``signal`` is a donor's text, shown sanitized and bounded."""
    what = "this session's pod" if event.session else "this cell's pod"
    why = (f"{what} is being stopped ({shown(event.signal, SIGNAL_SHOWN)}: Kubernetes is deleting it, as a "
           "preemption, a drain or an eviction does)")
    if event.checkpoint:
        return f"warning: {why}; checkpointing now: the cell is interrupted and its session's state written"
    if event.session:
        return f"warning: {why}; the cell is interrupted, and no checkpoint is armed, so the session's state goes"
    return f"warning: {why}; the cell is interrupted"


def _handle(event: object, sink: Sink, outcome: Outcome, run: Run) -> bool:
    """Apply one event; ``True`` when the run is over."""
    if isinstance(event, frames.Stream):
        outcome.seen_output = True
        sink.stream(event.name, event.text)
    elif isinstance(event, frames.DisplayData):
        outcome.seen_output = True
        _display(event.data, event.metadata, sink, _untrusted(run, outcome))
    elif isinstance(event, frames.Hello):
        outcome.hello = event
        outcome.state = "runner started, waiting for it to load the inputs"
    elif isinstance(event, frames.RunnerWarning):
        sink.notice(f"warning: {event.text}")
    elif isinstance(event, frames.Stopping):
        sink.notice(stopping_notice(event))
    elif isinstance(event, frames.FrameError):
        # what the frame carried is lost: say so rather than let an output or a figure vanish unexplained
        sink.notice(f"warning: a frame from the runner was dropped: {event.reason}")
    elif isinstance(event, Placed):
        sink.notice(event.text)
    elif isinstance(event, Relaunched):
        sink.notice(f"warning: {event.text}")
    elif isinstance(event, frames.Metrics):
        outcome.metrics = event
        sink.metrics(event)
    elif isinstance(event, frames.Error):
        outcome.remote_error = event
    elif isinstance(event, frames.Outputs):
        _take_outputs(event, outcome, run)
    elif isinstance(event, frames.Done):
        outcome.status = event.status
        outcome.gpu_peak = event.gpu_peak
        if event.status == "error" and outcome.remote_error is not None:
            err = outcome.remote_error
            outcome.error = RemoteError(err.ename, err.evalue, err.traceback)
        return True
    elif isinstance(event, RunnerExit):
        if outcome.status == "running":
            outcome.status = "died"
            if outcome.remote_error is not None:
                # the runner reported why it gave up (e.g. a Python version mismatch) before exiting
                err = outcome.remote_error
                outcome.error = RemoteError(err.ename, err.evalue, err.traceback)
            else:
                outcome.error = RunnerDied(event.code, event.detail)
        return True
    return False


def _stop(run: Run, sink: Sink, settings: FollowSettings, outcome: Outcome, status: str,
          watch: Watch | None) -> None:
    """Interrupt the cell, keep the output it still sends for ``grace`` seconds, then kill it (at once on
    one more cancel request)."""
    run.interrupt()
    outcome.status = status
    deadline = time.monotonic() + settings.grace
    presses = watch.cancel.presses if watch is not None else 0
    try:
        while time.monotonic() < deadline:
            event = run.next_event(POLL)
            if watch is not None:
                _publish(watch, event)
                if watch.cancel.presses > presses:
                    sink.notice("cancelled again: killing the runner")
                    run.kill()
                    return
            if isinstance(event, (frames.Done, RunnerExit)):
                return
            if isinstance(event, Queued):
                sink.notice(event.text)  # withdrawn from the queue: nothing ran
            elif isinstance(event, (frames.Stream, frames.DisplayData)):
                _handle(event, sink, outcome, run)
            elif isinstance(event, frames.Outputs):
                _take_outputs(event, outcome, run)  # discarded below: an interrupted run copies nothing back
        sink.notice(f"the runner did not stop within {settings.grace:g} s of the interrupt; killing it")
        run.kill()
    except KeyboardInterrupt:
        # a second Ctrl-C: do not wait any longer
        run.kill()


def load_outputs(outcome: Outcome, sink: Sink | None = None) -> dict[str, Any]:
    """The values an ``ok`` run sent back; buffers of any other run are discarded.

    From an untrusted cluster only a safe container is read; a name that cannot come back is a notice to
    ``sink``, and an error when ``--out`` asked for it.
    """
    outputs = outcome.outputs
    if outputs is None:
        return {}
    if outcome.status != "ok":
        discard_outputs(outcome)
        return {}
    outcome.outputs = None
    if outcome.untrusted_from is not None or outputs.format == "safe":
        # safe outputs from a trusted cluster too: its pod was placed while the cluster was not trusted
        notice = sink.notice if sink is not None else (lambda _text: None)
        return load_untrusted(outputs, outcome.untrusted_from or "its cluster", outcome.intake.wanted, notice)
    try:
        # held: an output array stays in shared memory while a variable holds it, and goes to the next cell
        # without a copy (runner/lending.py)
        values = buffers.load_packed(outputs.pickle, outputs.buffers, hold=True)
    except Exception as exc:
        raise OffloadError(
            f"The cell ran, but its outputs {', '.join(outputs.names)} could not be loaded here: {exc}. "
            "Your variables are untouched. Return plain data (numbers, arrays, dicts) or import the "
            "classes they need in the notebook first."
        ) from exc
    return dict(values)


def discard_outputs(outcome: Outcome) -> None:
    """Remove the shared-memory files of outputs that will not be loaded (a trusted run's only: what an
    untrusted run's references name may be any file of the kernel's)."""
    if outcome.outputs is not None and outcome.untrusted_from is None:
        packed = outcome.outputs.pickle
        refs = [*outcome.outputs.buffers, *([packed] if isinstance(packed, dict) else [])]
        buffers.discard(refs)
        outcome.outputs = None


def conclude(outcome: Outcome, namespace: MutableMapping[str, Any], sink: Sink | None = None) -> dict[str, Any]:
    """Load the outputs of a successful run into ``namespace`` (all or nothing) or raise its error; warnings
    about names that cannot come back go to ``sink``."""
    if outcome.error is not None:
        discard_outputs(outcome)
        raise outcome.error
    if outcome.status == "interrupted":
        discard_outputs(outcome)
        raise KeyboardInterrupt
    if outcome.status == "cancelled":
        # stopped through its cancel handle (the panel, `gpu-offload cancel`): to the cell, as Ctrl-C would
        discard_outputs(outcome)
        raise KeyboardInterrupt("the run was cancelled; no variable was copied back")
    if outcome.status != "ok":
        discard_outputs(outcome)
        raise OffloadError(f"The offloaded cell ended as `{outcome.status}`; no variable was copied back.")
    values = load_outputs(outcome, sink)
    namespace.update(values)
    return values


def describe(outcome: Outcome) -> str:
    """A few lines about a finished run for ``%gpu_offload status``."""
    lines = [f"last run: {outcome.status} in {outcome.elapsed:.2f} s"]
    if outcome.hello is not None:
        gpus = ", ".join(outcome.hello.gpus) or "none (CPU)"
        lines.append(f"runner: Python {outcome.hello.python}, pid {outcome.hello.pid}, GPUs: {gpus}")
    metrics = outcome.metrics
    if metrics is not None:
        for gpu in metrics.gpu:
            used, total = (None if v is None else v / 2**30 for v in (gpu.mem_used, gpu.mem_total))
            lines.append(
                f"GPU {gpu.index} {gpu.name}: {_num(gpu.util, '.0f')}% busy, {_num(used, '.1f')}/"
                f"{_num(total, '.1f')} GiB, {_num(gpu.temp, '.0f')} C, {_num(gpu.power, '.0f')} W"
            )
        if metrics.note:
            lines.append(metrics.note)
    return "\n".join(lines)


def _num(value: float | None, spec: str) -> str:
    # NVML leaves a field out when a GPU does not report it
    return "?" if value is None else format(value, spec)
