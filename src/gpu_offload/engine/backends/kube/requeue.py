"""Whether a one-shot run that Kueue preempted before it finished is queued again and rerun, in words.

A preempted cell that showed nothing yet loses nothing by running again: it is requeued and rerun once. One
that already printed or displayed something may have done things a rerun would repeat (a file written, a
message sent, a counter bumped), so it fails saying so, unless the user asked for the rerun with
``--rerun-on-preemption``. A run is rerun at most once: a second preemption fails it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .explain import CELL, PREEMPTED, FrontWords, PodState


@dataclass(frozen=True)
class Decision:
    """Rerun or not, and what the cell is told."""

    rerun: bool
    words: str


def after_preemption(state: PodState, shown: int, asked: bool, rerun_before: bool, finished: bool,
                     words: FrontWords = CELL) -> Decision | None:
    """The decision for a run whose pod ended as ``state`` (``None``: it was not preempted before finishing).

    ``shown``: outputs (stream chunks, displays) that reached the notebook or terminal; ``asked``:
    ``--rerun-on-preemption``; ``words``: how the front end that started the run names it."""
    if state.reason != PREEMPTED or finished:
        return None
    if rerun_before:
        return Decision(False, "; it had been rerun once already after a preemption, so it is not rerun again")
    if shown == 0:
        return Decision(True, f"{state.summary or 'preempted'} before it showed any output: queued again and "
                              f"rerun once (nothing of the first attempt reached {words.shown_in})")
    if asked:
        return Decision(True, f"{state.summary or 'preempted'}: queued again and rerun once, as "
                              "--rerun-on-preemption asks; its output so far (above) will repeat")
    return Decision(False, "; it had shown output already, so it is not rerun (a rerun would repeat what it did): "
                           f"run it again, or give --rerun-on-preemption to have {words.such} requeued and rerun once")
