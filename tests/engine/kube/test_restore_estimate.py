"""How long a session's restore should take (issue 27, "why am I waiting"): the estimator on literal timings, as
the cell words it. The cell path (said before the wait for the new pod, then the restore's own time) is in
test_session_survival.py."""

from __future__ import annotations

from gpu_offload.engine.backends.kube.restore_estimate import CHECKPOINT, RESTORE, Pace, Timed, estimate
from gpu_offload.engine.backends.kube.resume import imports_of

MIB = 2**20


def test_with_nothing_timed_there_is_no_estimate_and_it_says_why() -> None:
    assert estimate(5 * MIB, (), ()).text() == (
        "no estimate of its time yet: this kernel has not restored or timed a checkpoint before (this is the first)")


def test_one_restore_gives_its_pace_without_a_range() -> None:
    guess = estimate(20 * MIB, [Timed(10 * MIB, 2.0)], [Timed(1, 9.0)])
    assert guess.seconds == 4.0 and guess.low is None
    assert guess.text() == "it should take about 4 s, from this kernel's one restore (5.0 MiB/s)"


def test_a_fixed_part_is_kept_apart_from_the_part_that_grows_with_the_size() -> None:
    # 1 s of command and answer whatever the size, then 4 MiB/s: a proportional guess would say 0.9 s for 1 MiB
    timed = [Timed(1 * MIB, 1.25), Timed(8 * MIB, 3.0), Timed(16 * MIB, 5.0)]
    guess = estimate(12 * MIB, timed, ())
    assert guess.seconds is not None and abs(guess.seconds - 4.0) < 0.01
    assert guess.text() == "it should take about 4 s, from this kernel's last 3 restores (2.7 MiB/s)"


def test_timings_that_scatter_give_a_range_from_how_far_they_sat_from_the_line() -> None:
    timed = [Timed(10 * MIB, 2.0), Timed(10 * MIB, 6.0)]
    guess = estimate(10 * MIB, timed, ())
    assert (guess.seconds, guess.low, guess.high) == (4.0, 2.0, 6.0)
    assert guess.text() == "it should take about 4 s (between 2 s and 6 s), from this kernel's last 2 restores (2.5 MiB/s)"


def test_without_a_restore_the_checkpoints_are_used_and_said_to_be() -> None:
    guess = estimate(2 * MIB, (), [Timed(4 * MIB, 0.4)])
    assert guess.text() == ("it should take under 1 s, from this kernel's one checkpoint (10.0 MiB/s) as it has "
                            "restored none yet: a restore moves the bytes a checkpoint wrote")


def test_far_larger_than_anything_timed_there_is_no_estimate() -> None:
    guess = estimate(300 * MIB, [Timed(40 * 2**10, 0.3)], ())
    assert guess.seconds is None
    assert guess.text() == ("no estimate of its time yet: this kernel's one restore moved at most 40 KiB, too little to "
                            "tell the pace of 300.0 MiB")


def test_the_pace_keeps_the_recent_ones_and_ignores_sizes_that_are_not_byte_counts() -> None:
    pace = Pace()
    for size in ("12", -1, True, None, 3.5):  # a manifest's size comes from the runner: anything may be there
        pace.add(RESTORE, size, 1.0)
    pace.add(RESTORE, MIB, 0.0)  # a time of nothing says nothing of a pace
    assert pace.of(RESTORE) == ()
    for n in range(12):
        pace.add(CHECKPOINT, n * MIB, 1.0)
    assert [t.size // MIB for t in pace.of(CHECKPOINT)] == list(range(4, 12))


def test_from_checkpoints_the_imports_a_fresh_runner_does_first_are_said_not_counted() -> None:
    guess = estimate(MIB, (), [Timed(MIB, 0.1)], imports=["numpy", "torch"])
    assert guess.text().endswith("; not counted: the new runner's import of numpy, torch")
    assert not estimate(MIB, [Timed(MIB, 9.0)], (), imports=["torch"]).text().endswith("torch")  # a restore held it
    manifest = {"modules": {"np": "numpy", "threading": "threading", "F": "torch.nn.functional", "x": 3,
                            "evil": "a\nb"}}
    assert imports_of(manifest) == ["a b", "numpy", "torch"]
    assert imports_of({"modules": "torch"}) == []
