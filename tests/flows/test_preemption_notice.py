"""What the run says when Kueue stops a queued step's Job, read from the Job's successive states (pure)."""

from __future__ import annotations

from typing import Any

from gpu_offload.flows.preemption import (
    MAX_JOBS,
    JobTracker,
    Place,
    Readmitted,
    Stopped,
    readmitted_text,
    stopped_text,
)
from gpu_offload.flows.step_watch import queued_step
from gpu_offload.liqo_peering.kueue_stop import newest_stop_event, preempted_by
from gpu_offload.liqo_peering.untrusted_text import shown

from gpu_offload.engine.backends.kube.explain import PodContext, stopped_by_kueue

KUEUE_SAYS = ("Preempted to accommodate a workload (UID: 1f, JobUID: 2e) due to prioritization in the ClusterQueue; "
              "preemptor path: /gpu-offload; preemptee path: /gpu-offload")


def _job(suspend: bool, uid: str = "u1", step: str = "train", finished: str = "", **notes: str) -> dict[str, Any]:
    return {"metadata": {"name": "t-1234-abcde", "uid": uid,
                         "annotations": {"metaflow/step_name": step, "metaflow/task_id": "2", "metaflow/attempt": "0",
                                         **notes}},
            "spec": {"suspend": suspend},
            "status": {"conditions": [{"type": finished, "status": "True"}] if finished else []}}


def test_a_job_suspended_after_its_admission_is_a_stop_and_its_next_admission_a_readmission() -> None:
    tracker = JobTracker()
    assert tracker.seen(_job(True), 0.0) is None  # created suspended: queued
    assert tracker.seen(_job(False), 5.0) is None  # admitted: Metaflow says the task starts
    assert tracker.seen(_job(False), 6.0) is None  # a status change of the running Job
    stopped = tracker.seen(_job(True), 47.0)
    assert isinstance(stopped, Stopped) and stopped.ran == 42.0 and stopped.job.step == "train"
    assert tracker.seen(_job(True), 50.0) is None  # said once
    again = tracker.seen(_job(False), 107.0)
    assert isinstance(again, Readmitted) and again.waited == 60.0
    assert tracker.seen(_job(False, finished="Complete"), 130.0) is None


def test_a_finished_or_deleted_job_is_forgotten_and_the_jobs_followed_are_capped() -> None:
    tracker = JobTracker()
    tracker.seen(_job(False), 0.0)
    tracker.gone(_job(False))
    assert tracker.seen(_job(True), 1.0) is None  # seen anew, not a stop
    for n in range(MAX_JOBS + 5):
        tracker.seen(_job(False, uid=f"x{n}"), 0.0)
    assert tracker.seen(_job(True, uid=f"x{MAX_JOBS + 2}"), 1.0) is None  # past the cap: not followed
    assert isinstance(tracker.seen(_job(True, uid="x3"), 1.0), Stopped)


def test_the_preemption_is_said_with_kueues_reason_the_place_in_line_and_what_happens_next() -> None:
    tracker = JobTracker()
    tracker.seen(_job(False), 0.0)
    stopped = tracker.seen(_job(True), 72.0)
    assert isinstance(stopped, Stopped)
    assert stopped_text(stopped, KUEUE_SAYS, Place(0, 3, "gpu-offload")) == (
        "gpu-offload: step train (task 2, attempt 0) was preempted by a higher-priority run after 1 min. Its "
        "pod is gone and what it had done is lost; it waits in Kueue's queue again; 1st of 3 in LocalQueue "
        "gpu-offload and will rerun from its start once admitted; a higher priority (@gpu_offload(priority=...)), "
        "if you may use one, is preempted less")
    # another cause of eviction is said in Kueue's words; no event found: the suspension alone
    assert "was stopped by Kueue after 1 min (Exceeded the PodsReady timeout" in stopped_text(
        stopped, "Exceeded the PodsReady timeout", None)
    assert "was stopped after 1 min: its Job t-1234-abcde was suspended (Kueue evicted it)" in stopped_text(
        stopped, None, None)
    # the cell's sentence for the same span says the same, to the minute
    cell = stopped_by_kueue("", KUEUE_SAYS, stopped.ran, PodContext("donor-1", 1, "python:3.11"))
    assert cell.summary == "preempted after 1 min by a higher-priority run"
    readmitted = Readmitted(stopped.job, 61.0)
    assert readmitted_text(readmitted) == ("gpu-offload: step train (task 2, attempt 0) admitted by Kueue again after "
                                           "1 min 1 s in line; it reruns from its start")


def test_what_a_job_or_an_event_says_is_printed_bounded_and_without_control_characters() -> None:
    tracker = JobTracker()
    forged = "\x1b[2J\rtrain\nstep " + "x" * 500
    tracker.seen(_job(False, step=forged), 0.0)
    stopped = tracker.seen(_job(True, step=forged), 1.0)
    assert isinstance(stopped, Stopped)
    text = stopped_text(stopped, "Evicted\x07 " + "y" * 1000, None)
    assert all(c.isprintable() for c in text)
    assert len(stopped.job.step) <= 66 and "y" * 301 not in text
    assert shown("a\nb", 10) == "a b" and shown("abcdef", 3) == "abc..."
    # a forged "due to" is bounded too, and only Kueue's wording counts as a preemption
    assert preempted_by("", "Preempted to accommodate x due to " + "z" * 400) == f"by Kueue ({'z' * 120}...)"
    assert preempted_by("", "evicted") is None
    assert preempted_by("WorkloadEvictedDueToPreempted", "") == "by a higher-priority run"


def test_only_the_event_about_the_object_of_that_uid_counts() -> None:
    events = [{"involvedObject": {"uid": "old"}, "lastTimestamp": "2026-11-28T04:00:09Z", "message": "old"},
              {"involvedObject": {"uid": "u1"}, "lastTimestamp": "2026-11-28T04:00:01Z", "message": "first"},
              {"involvedObject": {"uid": "u1"}, "lastTimestamp": "2026-11-28T04:00:05Z", "message": "newest"}]
    assert (newest_stop_event(events, "u1") or {}).get("message") == "newest"
    assert newest_stop_event(events, "nobody") is None


def test_only_a_kubernetes_step_that_queues_is_watched() -> None:
    queued = {"labels": '{"kueue.x-k8s.io/queue-name": "gpu-offload"}', "run-id": "17", "k8s_namespace": "jhub-dora"}
    assert queued_step(["kubernetes", "step"], queued) == ("jhub-dora", "17", "gpu-offload")
    assert queued_step(["step"], queued) is None  # a step run locally
    assert queued_step(["kubernetes", "step"], {**queued, "labels": "{}"}) is None  # not through Kueue
    assert queued_step(["kubernetes", "step"], {**queued, "labels": "not json"}) is None
