"""Placement knows the CPU and memory free on each virtual node, and a cluster whose scheduler still cannot take
the pod (a neighbour took the GPUs between placement and scheduling) is retried once elsewhere; a cell pinned
to that cluster fails with the scheduler's reason instead.

Two donors: "small" has the most free GPUs (8 L4) but 16Gi of memory, "roomy" 4 A100 and 256Gi."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import origin_fixture, wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.explain import FAILED, MEMORY_ENV
from gpu_offload.engine.backends.kube.follow import PodEnded
from gpu_offload.engine.backends.kube.session import KubeSession
from gpu_offload.engine.errors import RemoteError

from .conftest import IMAGE_MAP, SHARED, backend_with_neighbours, leftovers, neighbour_takes_first, settings
from .helpers import run_cell

origin = origin_fixture(
    SHARED / "liqo-crds",
    donors=(liqo.Donor("roomy", 4, "A100", "2.00", memory="256Gi"),
            liqo.Donor("small", 8, "L4", "0.80", memory="16Gi")),
    image_map=IMAGE_MAP,
)


@pytest.fixture()
def kube(api_client: Any, namespace: str, core: Any, origin: Any) -> Iterator[KubernetesBackend]:
    yield from backend_with_neighbours(api_client, namespace, core, origin)


def neighbour_takes_small_first(origin: Any, core: Any, namespace: str) -> threading.Thread:
    """While this kernel's pod create is held (after placement chose "small"), a neighbour takes all of
    small's GPUs."""
    return neighbour_takes_first(origin, core, namespace, rf"^/api/v1/namespaces/{namespace}/pods$", "small-gpu", 8)


def test_placement_skips_a_donor_without_the_memory_the_cell_asks_for(kube: KubernetesBackend,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "64Gi")  # more than "small" has: the inventory knows, no retry is needed
    outcome, sink, run = run_cell(kube, "print('ran')", {})
    assert outcome.status == "ok", outcome.error
    assert "ran" in sink.text and not any("retrying" in n for n in sink.notices), sink.notices
    assert run.current.ctx.cluster == "roomy"




def test_a_cluster_whose_scheduler_cannot_take_the_pod_is_retried_once_on_another(kube: KubernetesBackend,
                                                                                   origin: Any, core: Any,
                                                                                   namespace: str) -> None:
    neighbour = neighbour_takes_small_first(origin, core, namespace)
    outcome, sink, run = run_cell(kube, "print('ran')", {})
    neighbour.join()
    assert outcome.status == "ok", (outcome.error, sink.notices, run.current.name)
    assert "ran" in sink.text
    retry = [n for n in sink.notices if "retrying once on roomy" in n]
    assert retry and "small cannot schedule the pod" in retry[0] and "nvidia.com/gpu" in retry[0], sink.notices
    assert run.current.ctx.cluster == "roomy"


def test_a_cell_pinned_to_the_cluster_gets_the_schedulers_reason_and_no_retry(kube: KubernetesBackend, origin: Any,
                                                                              core: Any, namespace: str) -> None:
    neighbour = neighbour_takes_small_first(origin, core, namespace)
    outcome, sink, run = run_cell(kube, "print('never')", {}, cluster="small")
    neighbour.join()
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Unschedulable", outcome.error
    assert "the scheduler says" in outcome.error.evalue and "--cluster small" in outcome.error.evalue
    assert not any("retrying" in n for n in sink.notices)
    assert "never" not in sink.text and run.current.ctx.cluster == "small"


def test_a_session_whose_pod_cannot_be_scheduled_starts_on_another_cluster_and_keeps_state(
        kube: KubernetesBackend, origin: Any, core: Any, namespace: str) -> None:
    neighbour = neighbour_takes_small_first(origin, core, namespace)
    variables: dict[str, Any] = {}
    outcome, sink, _ = run_cell(kube, "x = 41\nprint('first')", variables, session="train")
    neighbour.join()
    assert outcome.status == "ok", outcome.error
    assert "first" in sink.text
    retry = [n for n in sink.notices if "retrying once on roomy" in n]
    assert retry and "before the session started" in retry[0], sink.notices
    assert "roomy" in kube.sessions()[0].where
    outcome, sink, _ = run_cell(kube, "print(x + 1)", variables, session="train")
    assert outcome.status == "ok", outcome.error
    assert "42" in sink.text
    [placed] = sink.notices  # no second retry: only where the cell runs, the session's new pod
    assert "on virtual node roomy-gpu" in placed and placed.endswith("session train"), placed


def test_a_pinned_session_is_not_moved(kube: KubernetesBackend, origin: Any, core: Any, namespace: str) -> None:
    neighbour = neighbour_takes_small_first(origin, core, namespace)
    outcome, sink, _ = run_cell(kube, "print('never')", {}, session="pinned", cluster="small")
    neighbour.join()
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Unschedulable", outcome.error
    assert "--cluster small" in outcome.error.evalue and not any("retrying" in n for n in sink.notices)


def test_a_session_pod_that_never_ran_is_reported_before_anyone_may_attach_to_it(
        kube: KubernetesBackend, origin: Any, core: Any, namespace: str) -> None:
    # the session attaches to its pod's stdin once the follower says the pod stopped waiting; for a pod the
    # scheduler refused, the reason must already be waiting then, or the cell reports a failed attach instead
    neighbour = neighbour_takes_small_first(origin, core, namespace)
    session = KubeSession("pinned", kube, RunRequest(cluster="small"))
    try:
        follower = session.launched.follower
        assert follower.started.wait(60), "the follower never saw the pod stop waiting"
        assert not follower.running.is_set()
        ended = follower.events.get_nowait()  # the follower queued the reason before it said "started"
        while not isinstance(ended, PodEnded):
            ended = follower.events.get_nowait()
        assert ended.state.kind == FAILED and "small" in ended.state.text, ended.state
    finally:
        neighbour.join()
        session.close(grace=0)


def test_an_admin_chosen_bin_pack_policy_fills_the_smaller_donor_first(api_client: Any, core: Any,
                                                                       namespace: str) -> None:
    backend = KubernetesBackend(settings(namespace, policy="bin-pack"), api_client)
    try:
        outcome, _, run = run_cell(backend, "print('ran')", {})
        assert outcome.status == "ok", outcome.error
        assert run.current.ctx.cluster == "roomy"  # 3 GPUs left there against 7 on "small"
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)
