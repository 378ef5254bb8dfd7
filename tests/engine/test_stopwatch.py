"""A run's phases as ``%gpu_offload status --timing`` shows them: in order, no step negative, even when another
thread marked a later phase first."""

from __future__ import annotations

import pytest

from gpu_offload.engine.timing import Stopwatch

pytestmark = pytest.mark.fast


def test_a_phase_marked_before_an_earlier_one_bounds_it_so_no_step_is_negative() -> None:
    # the follower saw the pod scheduled (10.4 s) before submit returned and marked "submitted" (10.5 s)
    clock = Stopwatch(start=10.0)
    clock.mark("bundle", at=10.1)
    clock.mark("schedule", at=10.4)
    clock.mark("submitted", at=10.5)
    clock.mark("first line", at=11.0)
    timing = clock.record()
    assert [name for name, _ in timing.marks] == ["bundle", "submitted", "schedule", "first line"]
    offsets = [at for _, at in timing.marks]
    assert offsets == pytest.approx([0.1, 0.4, 0.4, 1.0])
    assert all(took >= 0 for _, took in timing.steps())


def test_marks_in_order_are_kept_as_they_are() -> None:
    clock = Stopwatch(start=0.0)
    for at, phase in enumerate(("analysis", "bundle", "submitted", "done"), start=1):
        clock.mark(phase, at=float(at))
    assert clock.record().marks == (("analysis", 1.0), ("bundle", 2.0), ("submitted", 3.0), ("done", 4.0))
