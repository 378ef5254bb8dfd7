"""A minimum runtime before preemption for interactive sessions, through what real Kueue offers.

Kueue (v0.19) has no minimum runtime of its own (a ``minAdmitDuration`` is proposed upstream, KEP-9876, not
released). What it does offer: a running pod's ``kueue.x-k8s.io/priority-class`` label may be changed from one
WorkloadPriorityClass to another (not added, not removed) and Kueue then updates its Workload's priority. So a
queued session pod starts at the hub's protected class, which nothing in the pool outranks, and once it has run
for the protection time the kernel relabels it to its own class: from then on Kueue may preempt it as any other
run of that class. Pure: the plan asks :func:`session_priority`; the backend's timer does the relabel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import OffloadUsageError
from ..base import RunRequest
from .config import KubeSettings


@dataclass(frozen=True)
class Protection:
    """A protected session pod: the class it starts with, and the one it is lowered to after ``seconds``."""

    starts_at: str
    lowers_to: str
    seconds: float


def session_priority(placement: RunRequest, session: bool, queue: str | None,
                     settings: KubeSettings) -> tuple[str | None, Protection | None]:
    """The pod's priority class and, for a protected session, its protection; refuses a cell that names the
    protected class itself (it is the kernel's to give and take back, never a run's own)."""
    own = placement.priority or (settings.priority if queue else None)
    protected = settings.protected_priority
    if protected and placement.priority == protected:
        raise OffloadUsageError(
            f"Nothing was launched: --priority {protected} is the class a session starts with while it is protected "
            "from preemption, and this kernel lowers it again; name your own class (`gpu-offload queues` lists "
            "them) or leave --priority out.")
    if not (session and queue and protected and settings.session_protection > 0 and placement.ranks is None):
        return own, None
    if not own:
        # Kueue refuses removing the label from a running pod: without a class to lower to, no protection
        return own, None
    return protected, Protection(protected, own, settings.session_protection)
