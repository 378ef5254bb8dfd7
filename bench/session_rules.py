"""The product's own decisions, asked by the trace replay (bench_sessions_replay.py) of whichever tree is imported.

Each rule is the product's pure code of that tree; where the tree has no such code, the replay does what that
tree's kernel did without it, and this module says so in :attr:`Rules.absent`:

- the idle timeout: ``kube/idle.IdleTimeouts`` (the hub's timeout, a session's shorter ``--idle-timeout``);
  absent: the hub's timeout for every session (the option did not exist);
- the class a session pod waits in line at, runs at while protected and is lowered to:
  ``kube/protection.session_priority``; absent: the session's own class, never protected;
- a preempted one-shot cell: ``kube/requeue.after_preemption`` (rerun once or fail); absent: it fails;
- whether a session's state outlives its pod: ``kube/resume.why_not_kept`` (with object storage); absent: its
  variables lived only in the pod, so they are gone;
- the start estimate a waiting cell shows: ``kube/wait_estimate.estimate``; absent: no estimate.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

_KUBE = "gpu_offload.engine.backends.kube"
HUB_IDLE_TIMEOUT = 3600.0
"""The chart's ``offload.sessionIdleTimeout`` (its default)."""
PROTECTION = 600.0
"""The chart's ``queueing.kueue.sessionProtection`` (its default)."""
PROTECTED = "session-protected"
CLASSES = {"batch": 100, "interactive": 1000, PROTECTED: 1001}
"""The chart's default classes; the hub adds the protected one one above the highest."""


@dataclass
class Rules:
    """The decisions of the tree on ``sys.path`` (imported lazily, once)."""

    absent: list[str] = field(default_factory=list)
    _idle: Any = None
    _priority: Any = None
    _requeue: Any = None
    _kept: Any = None
    _estimate: Any = None

    def __post_init__(self) -> None:
        from gpu_offload.engine.backends.base import RunRequest
        from gpu_offload.engine.backends.kube.config import KubeSettings

        self.request, self.settings = RunRequest, KubeSettings
        self._idle = self._one("idle.IdleTimeouts", "idle timeouts (--idle-timeout): the hub's for every session")
        self._priority = self._one("protection.session_priority",
                                   "session protection: a session pod runs at its own class from the start")
        self._requeue = self._found(("requeue.after_preemption", "explain.PodState", "explain.PREEMPTED"),
                                    "rerun on preemption: a preempted one-shot cell fails")
        self._kept = self._one("resume.why_not_kept", "checkpoints: a session's variables live only in its pod")
        self._estimate = self._found(("wait_estimate.estimate", "wait_estimate.QUOTA"),
                                     "the start estimate: a waiting cell shows none")

    def _found(self, names: tuple[str, ...], absent: str) -> tuple[Any, ...] | None:
        """The tree's objects ``names`` (``module.name`` of ``kube/``), or None, ``absent`` noted, when it lacks one."""
        try:
            return tuple(getattr(importlib.import_module(f"{_KUBE}.{module}"), name)
                         for module, _, name in (n.rpartition(".") for n in names))
        except (ImportError, AttributeError):
            self.absent.append(absent)
            return None

    def _one(self, name: str, absent: str) -> Any:
        found = self._found((name,), absent)
        return None if found is None else found[0]

    def idle_timeout(self, name: str, asked: float | None) -> float:
        """Seconds session ``name`` (whose cells ask ``--idle-timeout`` ``asked``) may sit idle; 0: never released."""
        if self._idle is None:
            return HUB_IDLE_TIMEOUT
        timeouts = self._idle(HUB_IDLE_TIMEOUT)
        timeouts.ask(name, asked)
        return float(timeouts.of(name).seconds)

    def session_class(self, gpus: int, own: str) -> tuple[str, str, str, float]:
        """(the class a session pod waits in line at, the class it runs at while protected, the class it is lowered
        to, seconds of protection)."""
        if self._priority is None:
            return own, own, own, 0.0
        settings = self.settings(namespace="replay", queue="gpu-offload", priority="interactive",
                                 session_protection=PROTECTION, protected_priority=PROTECTED)
        starts, protection = self._priority(self.request(gpus=gpus, priority=own), True, "gpu-offload", settings)
        if protection is None:
            return starts, starts, starts, 0.0
        if hasattr(protection, "starts_at"):
            # the trees of c229887 and before: the pod waited in line at the protected class already
            return protection.starts_at, protection.starts_at, protection.lowers_to, float(protection.seconds)
        return starts, protection.protected, protection.own, float(protection.seconds)

    def rerun(self, ran: float, shown: bool, asked: bool, rerun_before: bool) -> bool:
        """Whether a one-shot cell preempted after ``ran`` seconds is queued again and rerun."""
        if self._requeue is None:
            return False
        after_preemption, pod_state, preempted = self._requeue
        state = pod_state("failed", reason=preempted, summary=f"preempted after {ran:.0f} s by a higher-priority run")
        decision = after_preemption(state, 1 if shown else 0, asked, rerun_before, False)
        return bool(decision is not None and decision.rerun)

    def state_kept(self, gpus: int) -> bool:
        """Whether a session's variables outlive its pod (with object storage, the chart's default)."""
        return self._kept is not None and self._kept(self.request(gpus=gpus), True) is None

    def estimate_range(self, position: int, admissions: list[float], now: float
                       ) -> tuple[float | None, float | None, float | None]:
        """The wait a cell at ``position`` in line is told and its range, given the queue's admissions seen."""
        if self._estimate is None:
            return None, None, None
        estimate, quota = self._estimate
        guess = estimate(position, admissions, 0.0, now, quota)
        return guess.seconds, guess.low, guess.high

    def estimate(self, position: int, admissions: list[float], now: float) -> float | None:
        """The wait a cell at ``position`` in line is told, given the queue's admissions seen; None: none."""
        if self._estimate is None:
            return None
        estimate, quota = self._estimate
        guess = estimate(position, admissions, 0.0, now, quota)
        return None if guess.seconds is None else float(guess.seconds)
