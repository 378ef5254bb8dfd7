"""What the kubernetes backend downloads of an untrusted run's outputs frame: only its one stored safe container,
and only when the frame declares at most 1 GiB for it (pure: no storage is touched)."""

from __future__ import annotations

from gpu_offload.engine.backends.kube.podspec import UNTRUSTED_STORED_MAX, untrusted_unfetched

REF = {"kind": "url", "url": "http://s3/out-0", "index": 0, "sha256": "0" * 64}


def test_a_stored_safe_container_within_the_bound_may_be_fetched() -> None:
    assert untrusted_unfetched("safe", {**REF, "size": 5 << 20}, ()) is None


def test_a_declared_size_over_the_bound_is_a_refusal_without_a_download() -> None:
    refused = untrusted_unfetched("safe", {**REF, "size": UNTRUSTED_STORED_MAX + 1}, ())
    assert refused["kind"] == "refused" and "at most 1073741824 (1 GiB); nothing was downloaded" in refused["reason"]
    assert untrusted_unfetched("safe", {**REF, "size": "big"}, ())["kind"] == "refused"


def test_what_the_kernel_refuses_anyway_stays_as_it_came() -> None:
    ref = {**REF, "size": 10}
    assert untrusted_unfetched("pickle", ref, ()) is ref  # refused by format, unread
    assert untrusted_unfetched("safe", ref, ({"kind": "url"},)) is ref  # refused for its buffers, unread
