"""A minimum runtime before preemption for interactive sessions, through what real Kueue offers.

Kueue (v0.19) has no minimum runtime of its own (a ``minAdmitDuration`` is proposed upstream, KEP-9876, not
released). What it does offer: a running pod's ``kueue.x-k8s.io/priority-class`` label may be changed from one
WorkloadPriorityClass to another (not added, not removed) and Kueue then updates its Workload's priority. So a
session pod waits in line at its own class, like any run of that class; once its runner runs, the kernel raises it
to the hub's protected class, which nothing in the pool outranks, and once it has run for the protection time
lowers it to its own class again: from then on Kueue may preempt it as any other run of that class.

Why not start at the protected class: a pod's class is also its place in line and what it may preempt to be
admitted. A pending session at the protected class jumped every queue and preempted runs of every class, sessions
past their own protection included; on a saturated pool sessions then preempted one another every few minutes
(the sessions trace replay, bench/bench_sessions_replay.py, measured it). Protection is a minimum runtime, not a
better place in line. Pure: the plan asks :func:`session_priority`; the backend's timer does the two relabels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import OffloadUsageError
from ..base import RunRequest
from .config import KubeSettings


@dataclass(frozen=True)
class Protection:
    """A protected session pod: it waits and is admitted at ``own`` (its own class), is raised to ``protected``
    once it runs, and lowered to ``own`` again after ``seconds`` of running."""

    own: str
    protected: str
    seconds: float


def session_priority(placement: RunRequest, session: bool, queue: str | None,
                     settings: KubeSettings) -> tuple[str | None, Protection | None]:
    """The class the pod is created (and waits in line) at and, for a protected session, its protection; refuses a
    cell that names the protected class itself (it is the kernel's to give and take back, never a run's own)."""
    own = placement.priority or (settings.priority if queue else None)
    protected = settings.protected_priority
    if protected and placement.priority == protected:
        raise OffloadUsageError(
            f"Nothing was launched: --priority {protected} is the class a session runs at while it is protected "
            "from preemption, and this kernel lowers it again; name your own class (`gpu-offload queues` lists "
            "them) or leave --priority out.")
    if not (session and queue and protected and settings.session_protection > 0 and placement.ranks is None):
        return own, None
    if not own:
        # Kueue refuses adding the label to a running pod: without a class of its own to raise from, no protection
        return own, None
    return own, Protection(own, protected, settings.session_protection)
