"""Running one cell through the real engine on a backend, the way the magic does, for the kube tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.engine import FollowSettings, Outcome, conclude, follow
from gpu_offload.engine.execution import Launch, intake
from gpu_offload.engine.ranked import RankedRun
from gpu_offload.runner import buffers


@dataclass
class Sink:
    """A sink that keeps what the notebook would show and can react to a line (to inject a fault)."""

    on_line: Callable[[str], None] | None = None
    text: str = ""
    notices: list[str] = field(default_factory=list)
    displays: list[Any] = field(default_factory=list)
    displays_with_metadata: list[tuple[Any, Any]] = field(default_factory=list)

    def stream(self, name: str, text: str) -> None:
        self.text += text
        if self.on_line is not None:
            self.on_line(text)

    def display(self, data: Any, metadata: Any) -> None:
        self.displays.append(data)
        self.displays_with_metadata.append((data, metadata))

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def metrics(self, metrics: Any) -> None:
        pass


def run_cell(backend: Any, cell: str, namespace: dict[str, Any], sink: Sink | None = None,
             session: str | None = None, follow_settings: FollowSettings | None = None,
             **placement: Any) -> tuple[Outcome, Sink, Any]:
    """Submit ``cell``, follow it into ``sink``, release the run; returns outcome, sink and the run.

    Outputs are loaded into ``namespace`` when the run succeeded; a failed run keeps its error in the outcome.
    """
    sink = sink or Sink()
    analysis = analyse_cell(cell, namespace)
    job, refs = build_job(cell, analysis, namespace, backend.transfer,
                          request=RunRequest(**{"gpus": 1, **placement}), session=session)
    run = backend.submit(job)
    settings = follow_settings or FollowSettings(progress_after=1.0, grace=10.0)
    if job.request.ranks is not None:  # a distributed run, followed as the engine's start() wraps it
        run = RankedRun(run, job.request.ranks, settle=settings.grace if session is not None else None)
    try:
        outcome = follow(run, sink, settings, intake(backend, Launch(analysis)))
    finally:
        run.release(10.0)
        buffers.discard(refs)
    if outcome.error is None and outcome.status == "ok":
        conclude(outcome, namespace, sink)
    return outcome, sink, run


def cell_in_thread(backend: Any, cell: str, session: str,
                   **placement: Any) -> tuple[threading.Thread, dict[str, Any], Sink]:
    """Start ``cell`` of ``session`` in a thread and return once it printed ``changing`` (the cell is running);
    ``result["run"]`` holds :func:`run_cell`'s answer once the thread ends, the sink what the cell was told."""
    started = threading.Event()
    sink = Sink(on_line=lambda text: started.set() if "changing" in text else None)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(run=run_cell(backend, cell, {}, sink, session=session,
                                                                        **placement)))
    thread.start()
    wait_until(started.is_set, "the cell running", timeout=120)
    return thread, result, sink
