"""kube/resume.why_not_kept: the one rule for whether a session's state outlives its pod, as SessionKeeper follows
it and the words a refused cell gets."""

from __future__ import annotations

from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.resume import NO_STORAGE, SessionKeeper, why_not_kept


def test_a_session_is_kept_with_storage_distributed_or_not() -> None:
    assert why_not_kept(RunRequest(gpus=2), storage=True) is None
    assert why_not_kept(RunRequest(), storage=False) == NO_STORAGE
    assert why_not_kept(RunRequest(ranks=Ranks(2, 1)), storage=True) is None  # each rank's state, per rank
    assert why_not_kept(RunRequest(ranks=Ranks(2, 1)), storage=False) == NO_STORAGE


def test_a_kernel_without_storage_says_why_a_session_starts_empty() -> None:
    keeper = SessionKeeper(None, lambda _cluster: True)
    words = keeper.resume_words("train", RunRequest())
    assert words == f"start the session again in a new pod, empty: {NO_STORAGE}, so its variables are gone"
    assert keeper.resume_words("train", RunRequest(ranks=Ranks(2, 1))) == (
        f"start the session again in a new Job, empty: {NO_STORAGE}, so its variables are gone")
