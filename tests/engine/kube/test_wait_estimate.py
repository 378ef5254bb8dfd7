"""Why a queued run waits and when it starts (issue 27): the estimator on literal inputs, and the kernel's count
of runs leaving the line from which the estimate's history comes."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering.queue_client import KueueClient
from kubernetes.client import ApiClient

from gpu_offload.engine.backends.kube.queueing import QueueWatch
from gpu_offload.engine.backends.kube.wait_estimate import (
    NO_FIT,
    PREEMPTING,
    QUOTA,
    UNKNOWN,
    estimate,
    kueue_message,
    reason_of,
    waiting_messages,
)


@pytest.mark.parametrize(("message", "reason"), [
    # the messages of Kueue's QuotaReserved=False condition, as Kueue words them
    ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor a, "
     "1 more needed", QUOTA),
    ("couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor a, previously "
     "considered podsets requests (0) + current podset request (4) > maximum capacity (2)", NO_FIT),
    # one reason per flavor: a flavor that will hold it once quota frees makes the wait worth it
    ("couldn't assign flavors to pod set main: flavor a doesn't match node affinity, insufficient unused quota for "
     "nvidia.com/gpu in flavor b, 1 more needed", QUOTA),
    ("couldn't assign flavors to pod set main: flavor a doesn't match node affinity", NO_FIT),
    ("Pending the preemption of 1 workload(s)", PREEMPTING),
    ("something Kueue may say one day", UNKNOWN),
])
def test_reason_of_kueue_messages(message: str, reason: str) -> None:
    assert reason_of(message) == reason


def test_steady_pace_gives_position_plus_one_over_rate() -> None:
    # one admission a minute for 10 minutes; 4th in line (position 3) needs 4 more: about 4 minutes
    admissions = [60.0 * i for i in range(1, 11)]
    guess = estimate(3, admissions, 0.0, 600.0, QUOTA)
    assert guess.seconds == pytest.approx(240.0)
    assert guess.low is not None and guess.high is not None and guess.low < 240.0 < guess.high
    assert "it starts in about 4 min, between " in guess.text() and " if that pace holds" in guess.text()
    assert "an estimate from the line's recent pace (10 admissions in the last 10 min)" in guess.text()
    assert "every GPU the queue may use is taken" in guess.text()
    # further back in line, the wait is proportionally longer and the range relatively narrower
    far = estimate(19, admissions, 0.0, 600.0, QUOTA)
    assert far.seconds == pytest.approx(1200.0)
    assert far.low is not None and far.high is not None
    assert (far.high - far.low) / far.seconds < (guess.high - guess.low) / guess.seconds


def test_a_stalled_line_slows_the_estimate() -> None:
    # the same 10 admissions, then 10 quiet minutes: the pace halves, the wait doubles
    admissions = [60.0 * i for i in range(1, 11)]
    assert estimate(3, admissions, 0.0, 1200.0, QUOTA).seconds == pytest.approx(480.0)


def test_only_recent_admissions_set_the_pace() -> None:
    # an hour of slow admissions, then 20 quick ones: only the last 20 count (and the gap before them)
    slow = [600.0 * i for i in range(1, 7)]
    fast = [3600.0 + 10.0 * i for i in range(1, 21)]
    guess = estimate(0, slow + fast, 0.0, 3800.0, QUOTA)
    assert guess.seconds == pytest.approx(200.0 / 20)


def test_a_range_from_nothing_is_said_as_within() -> None:
    # at the head of a line with a bursty pace the range reaches down to now: "within", not "between 0 s and"
    guess = estimate(0, [300.0] * 10, 0.0, 600.0, QUOTA)
    assert guess.low == 0.0 and guess.high is not None
    assert f"within {round(guess.high / 60)} min if that pace holds" in guess.text() and "between" not in guess.text()


def test_burst_keeps_the_centre_and_widens_the_range() -> None:
    steady = [60.0 * i for i in range(1, 11)]
    burst = [300.0] * 10  # the same 10 admissions in 10 minutes, all at once
    a, b = estimate(5, steady, 0.0, 600.0, QUOTA), estimate(5, burst, 0.0, 600.0, QUOTA)
    assert a.seconds == pytest.approx(b.seconds)
    assert a.high is not None and b.high is not None and b.high > a.high


@pytest.mark.parametrize(("admissions", "since", "now"), [
    ([], 0.0, 600.0),  # nothing admitted yet
    ([100.0, 200.0], 0.0, 600.0),  # two admissions are not a pace
    ([10.0, 10.0, 10.0, 10.0], 0.0, 20.0),  # a burst seen right after starting to watch
    ([60.0 * i for i in range(1, 11)], 590.0, 600.0),  # history from before the watch began does not count
])
def test_too_little_history_gives_no_estimate(admissions: list[float], since: float, now: float) -> None:
    guess = estimate(2, admissions, since, now, QUOTA)
    assert guess.seconds is None and guess.low is None and guess.high is None
    assert "no estimate of the start yet" in guess.text() and "too little history" in guess.text()


@pytest.mark.parametrize(("reason", "words"), [
    (PREEMPTING, "it starts once the preempted run has stopped"),
    (NO_FIT, "the queue's pace says nothing about when the pool changes"),
])
def test_reasons_the_pace_does_not_govern_give_no_number(reason: str, words: str) -> None:
    guess = estimate(0, [60.0 * i for i in range(1, 11)], 0.0, 600.0, reason)
    assert guess.reason == reason and guess.seconds is None and words in guess.text()


def test_not_listed_as_pending_gives_no_estimate() -> None:
    guess = estimate(None, [60.0 * i for i in range(1, 11)], 0.0, 600.0, UNKNOWN)
    assert guess.seconds is None and "waiting for Kueue to admit it" in guess.text()


def test_the_watch_counts_runs_leaving_the_line_ahead_of_its_pods() -> None:
    # no request is made: the watch is not started, its reads are applied by hand
    watch = QueueWatch(KueueClient(ApiClient()), "team-a", "gpu-offload", "gpu-offload")
    first, second = watch.track("pod-a", "1 GPU"), watch.track("pod-b", "1 GPU")
    watch._read({"pod-a": 4, "pod-b": 6})
    assert first.admissions == () and first.position == 4
    watch._read({"pod-a": 2, "pod-b": 4})  # two runs ahead of both left: two departures, not four
    assert len(first.admissions) == 2 and second.admissions == first.admissions
    watch._read({"pod-b": 1})  # pod-a was admitted (itself and the two ahead of it): three more
    assert len(second.admissions) == 5
    # five departures, but seen within a moment of starting to watch: not yet a pace
    assert "too little history" in second.text() and second.text().startswith("queued for 1 GPU: 2nd in line; ")
    watch.forget(first)
    watch.forget(second)
    # the next wait starts its count anew: nothing was watched while no run waited
    third = watch.track("pod-c", "1 GPU")
    watch._read({"pod-c": 0})
    assert third.admissions == () and "no estimate of the start yet" in third.text()


def _workload(pod: str, status: str, message: str) -> dict[str, object]:
    return {"metadata": {"name": f"pod-{pod}-1a2b3", "ownerReferences": [{"kind": "Pod", "name": pod}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": status, "reason": "Pending",
                                       "message": message}]}}


def test_kueues_reason_is_read_per_pod_from_the_quota_reserved_condition_of_its_workload() -> None:
    waiting = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor a100, "
               "1 more needed")
    found = waiting_messages([_workload("pod-a", "False", waiting), _workload("pod-b", "True", "Quota reserved"),
                              {"metadata": {"name": "job-x", "ownerReferences": [{"kind": "Job", "name": "x"}]},
                               "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                                          "message": "a distributed run's"}]}},
                              {"metadata": {"name": "rs-y", "ownerReferences": [{"kind": "ReplicaSet", "name": "y"}]},
                               "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                                          "message": "not a run's"}]}},
                              {"metadata": {"name": "fresh"}}])
    # by owner: a pod, or a distributed run's Job; admitted (pod-b), another kind's, one without a condition: none
    assert found == {"pod-a": waiting, "x": "a distributed run's"}


def test_kueues_message_reaches_the_notebook_on_one_printable_line_and_cut() -> None:
    forged = "line one\n\x1b[2Jcleared\tscreen " + "x" * 400
    text = kueue_message(_workload("p", "False", forged))
    assert text.startswith("line one [2Jcleared screen x") and "\x1b" not in text and "\n" not in text
    assert len(text) == 300 and text.endswith("...")


def test_the_place_in_line_shows_kueues_words_and_the_reason_they_give() -> None:
    watch = QueueWatch(KueueClient(ApiClient()), "team-a", "gpu-offload", "gpu-offload")
    ticket = watch.track("pod-a", "1 GPU")
    watch._read({"pod-a": 1})
    assert "Kueue:" not in ticket.text()  # not read yet: the place alone
    before = ticket.version
    watch._read({"pod-a": 1}, {"pod-a": "Pending the preemption of 1 workload(s)"})
    assert ticket.version == before + 1  # a new reason is shown even though the place did not change
    lines = ticket.text().splitlines()
    assert lines[0].startswith("queued for 1 GPU: 2nd in line; waiting ")
    assert lines[1] == "  Kueue: Pending the preemption of 1 workload(s)"
    assert lines[2].startswith("  Kueue is stopping a lower-priority run to make room for it; no estimate")
    watch._read({"pod-a": 0}, None)  # the Workloads not read this time: the last reason stands
    assert "Kueue: Pending the preemption" in ticket.text()
    watch._read({"pod-a": 0}, {})  # read, and no longer held back for a reason
    assert "Kueue:" not in ticket.text()
