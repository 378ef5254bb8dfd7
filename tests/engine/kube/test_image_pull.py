"""A runner pod pulling its image (issue 27, "why am I waiting"): the kubelet's ``Pulling``/``Pulled`` messages read
strictly, and the words a waiting cell shows. The messages are written as the kubelet's image manager formats
them (``pkg/kubelet/images/image_manager.go``: ``"Pulling image %q"`` and ``"Successfully pulled image %q in %v (%v
including waiting). Image size: %v bytes."``, before 1.30 without the size). The cell path is in
test_faults.py (the sandbox's ``slow-pull``); the real cluster here has its images imported, never pulled."""

from __future__ import annotations

from typing import Any

from gpu_offload.engine.backends.kube.image_pull import (
    Pulled,
    estimate,
    go_seconds,
    pulled,
    pulling_image,
    pulling_now,
    same_image,
)

UID = "0f7c"


def _event(reason: str, message: str, at: str, uid: str = UID) -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": at, "involvedObject": {"kind": "Pod", "uid": uid}}


def test_the_kubelets_messages_are_read() -> None:
    assert pulling_image('Pulling image "nvcr.io/nvidia/pytorch:24.05-py3"') == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert pulled('Successfully pulled image "nvcr.io/nvidia/pytorch:24.05-py3" in 2m3.456s (2m10.5s including '
                  'waiting). Image size: 9876543210 bytes.') == Pulled("nvcr.io/nvidia/pytorch:24.05-py3", 130.5,
                                                                       9876543210)
    # a kubelet before 1.30 says no size; under a second Go writes milliseconds
    assert pulled('Successfully pulled image "busybox:latest" in 850ms (850ms including waiting)') == Pulled(
        "busybox:latest", 0.85, None)
    assert go_seconds("1h0m0s") == 3600 and go_seconds("0s") == 0 and go_seconds("1.5µs") == 1.5e-6


def test_anything_but_the_kubelets_form_counts_for_nothing() -> None:
    assert pulled('Container image "python:3.11-slim" already present on machine') is None
    real = 'Successfully pulled image "busybox:latest" in 1s (1s including waiting). Image size: 10 bytes.'
    assert pulled(real) is not None
    for forged in (real + "\nSuccessfully pulled", real + " and more", "x" + real, real.replace("1s (", "soon (")):
        assert pulled(forged) is None, forged
    assert pulled('Successfully pulled image "' + "a" * 5000 + '" in 1s (1s including waiting)') is None
    assert pulling_image('Pulling image "a"\nPulling image "b"') is None


def test_a_pod_is_pulling_from_its_pulling_event_until_its_pulled_or_failed_one() -> None:
    pulling = _event("Pulling", 'Pulling image "busybox:latest"', "2026-11-28T10:00:00Z")
    assert pulling_now([pulling], UID, "busybox")  # the kubelet names the default tag the pod left out
    assert not pulling_now([pulling], "another-pod-of-that-name", "busybox")
    assert not pulling_now([pulling], UID, "python:3.11-slim")
    done = _event("Pulled", 'Successfully pulled image "busybox:latest" in 3s (3s including waiting)',
                  "2026-11-28T10:00:03Z")
    assert not pulling_now([done, pulling], UID, "busybox")
    failed = _event("Failed", 'Failed to pull image "busybox:latest": not found', "2026-11-28T10:00:04Z")
    assert not pulling_now([pulling, failed], UID, "busybox")
    assert same_image("busybox", "busybox:latest") and not same_image("busybox:1", "busybox:latest")


def _pulls(*seconds: float) -> list[dict[str, Any]]:
    return [_event("Pulled", f'Successfully pulled image "torch:2" in {s}s ({s}s including waiting). Image size: '
                             f"{3 * 2**30} bytes.", f"2026-11-28T10:0{i}:00Z", uid=f"old-{i}")
            for i, s in enumerate(seconds)]


def test_the_words_while_pulling() -> None:
    assert estimate("torch:2", 12, []).text() == (
        "pulling image torch:2 for 12 s; no earlier pull of it in this namespace to estimate from (Kubernetes keeps "
        "events about an hour)")
    assert estimate("torch:2", 12, _pulls(30, 40, 200)).text() == (
        "pulling image torch:2 for 12 s; earlier pulls of it in this namespace took about 40 s (the median of 3; "
        "3.0 GiB): about 28 s left")
    assert estimate("torch:2", 50, _pulls(40)).text() == (
        "pulling image torch:2 for 50 s; earlier pulls of it in this namespace took about 40 s (one pull; 3.0 GiB): "
        "this one is taking longer than any of them")
    assert estimate("torch:2", 41, _pulls(40, 41.5)).text().endswith(": it should end any moment (the slowest took "
                                                                      "42 s)")


def test_an_image_name_from_an_event_is_shown_on_one_line() -> None:
    words = estimate("evil\x1b[2J\nname", 1, []).text()
    assert "\n" not in words and "\x1b" not in words
