"""What Kueue says when it stops a run, read the same way by every front end (pure functions).

Kueue stops a Workload's pods when it evicts it: a plain pod is deleted, a Job is suspended (its pods deleted
by the Job controller) and requeued. Either way it records a ``Stopped`` event on the object with the
eviction's message ("Preempted to accommodate a workload ... due to prioritization in the ClusterQueue", or
another cause's words). Events and their messages are untrusted text: anyone who may write events in the
namespace can forge one, so what is shown goes through ``untrusted_text.shown``, and an event counts only for the
uid of the object it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .untrusted_text import shown

STOPPED = "Stopped"
"""The reason of the event Kueue records on a pod it deletes or a Job it suspends."""


def stop_event_selector(kind: str, name: str) -> str:
    """The field selector of the ``Stopped`` events on the ``kind`` (Pod or Job) ``name``."""
    return f"involvedObject.kind={kind},involvedObject.name={name},reason={STOPPED}"


def newest_stop_event(events: Iterable[Mapping[str, Any]], uid: str) -> Mapping[str, Any] | None:
    """The newest of ``events`` about the object of ``uid`` (an older object of the same name does not count)."""
    mine = [e for e in events if (e.get("involvedObject") or {}).get("uid") == uid]
    mine.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return mine[-1] if mine else None


def preempted_by(reason: str, message: str) -> str | None:
    """Who preempted the run, in words (``by a higher-priority run``, or ``by Kueue (<why>)`` for another
    kind of preemption, e.g. reclaiming a borrowed quota), or None when Kueue stopped it for another cause.

    ``reason`` is a pod's ``TerminationTarget`` condition reason (``WorkloadEvictedDueToPreempted``), empty
    when only the event's message is known."""
    if not (reason.endswith("DueToPreempted") or message.startswith("Preempted to accommodate")):
        return None
    why = shown(message.partition(" due to ")[2].partition(";")[0], 120)
    return "by a higher-priority run" if not why or why.startswith("prioritization") else f"by Kueue ({why})"
