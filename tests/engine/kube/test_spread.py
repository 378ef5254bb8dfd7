"""Where a distributed run's pods go on the kubernetes backend, through the sandbox with the real engine and
runner: all on one donor unless ``--spread``; with it, on the donors that together have room (the ranks still
meet at rank 0's Service); a Job one of whose pods cannot be scheduled is deleted and launched once more on
another donor. Every test leaves no Job, pod, Service or Secret.

Two donors: "east" has the most free GPUs (6), "west" 4; placement's default (most free) picks east first."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import origin_fixture, wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError, RemoteError

from .conftest import IMAGE_MAP, SHARED, backend_with_neighbours, neighbour_takes_first, settings
from .helpers import run_cell
from .test_distributed import ALL_REDUCE, TORCH_IMAGE, everything_left

origin = origin_fixture(
    SHARED / "liqo-crds",
    donors=(liqo.Donor("east", 6, "A100", "2.00"), liqo.Donor("west", 4, "A100", "2.00")),
    image_map=IMAGE_MAP,
)
ONE_RANK_EACH = Ranks(nodes=2, procs_per_node=1)


@pytest.fixture()
def kube(api_client: Any, namespace: str, core: Any, origin: Any) -> Iterator[KubernetesBackend]:
    yield from backend_with_neighbours(api_client, namespace, core, origin)
    wait_until(lambda: not everything_left(api_client, namespace), "no Job, pod, Service or Secret left behind",
               timeout=120)


def placed_on(notices: list[str]) -> list[str]:
    """The virtual nodes the run's pods were shown running on, in the order the notices came."""
    return [n.split(" on virtual node ")[1].split(" ")[0] for n in notices if " on virtual node " in n]


def test_without_spread_the_pods_stay_on_one_donor_and_nothing_is_created_when_none_fits(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    # 2 pods x 4 GPUs: 8 on one donor, which neither has
    with pytest.raises(OffloadUsageError, match="Nothing was launched: .*add --spread to let them span clusters"):
        run_cell(kube, "print('never')", {}, image=TORCH_IMAGE, gpus=4, ranks=ONE_RANK_EACH)
    assert everything_left(api_client, namespace) == []


def test_a_run_that_fits_one_donor_stays_there_even_with_spread(kube: KubernetesBackend) -> None:
    outcome, sink, run = run_cell(kube, ALL_REDUCE, {"base": 0}, image=TORCH_IMAGE, gpus=2,
                                  ranks=Ranks(nodes=2, procs_per_node=1, spread=True), timeout=600)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert sorted(placed_on(sink.notices)) == ["east-gpu", "east-gpu"], sink.notices


def test_with_spread_the_pods_span_the_donors_that_together_have_room_and_the_ranks_meet(
        kube: KubernetesBackend) -> None:
    # 2 pods x 4 GPUs: east (6) holds one, west (4) the other; rank 1 finds rank 0 on the other donor by the
    # Service's short name (the namespace is offloaded to both)
    user_ns: dict[str, Any] = {"base": 100}
    outcome, sink, run = run_cell(kube, ALL_REDUCE, user_ns, image=TORCH_IMAGE, gpus=4,
                                  ranks=Ranks(nodes=2, procs_per_node=1, spread=True), timeout=600)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert sorted(sink.text.splitlines()) == [f"[rank {r}] rank {r} of 2: sum 3" for r in range(2)]
    assert user_ns["result"] == (0, 103)
    assert sorted(placed_on(sink.notices)) == ["east-gpu", "west-gpu"], sink.notices


def neighbour_takes_east_first(origin: Any, core: Any, namespace: str, gpus: int) -> threading.Thread:
    """While this kernel's Job create is held (after placement chose east), a neighbour takes ``gpus`` of
    east's GPUs, so one pod of the Job finds no room."""
    return neighbour_takes_first(origin, core, namespace, rf"^/apis/batch/v1/namespaces/{namespace}/jobs$",
                                 "east-gpu", gpus)


def test_a_job_one_of_whose_pods_cannot_be_scheduled_is_retried_once_on_another_donor(
        kube: KubernetesBackend, origin: Any, core: Any, namespace: str) -> None:
    # placement sees 6 free on east for 2 pods x 2; the neighbour leaves 2, so one pod starts (and waits in
    # init_process_group, showing nothing) and the other is unschedulable: the Job moves to west
    neighbour = neighbour_takes_east_first(origin, core, namespace, gpus=4)
    user_ns: dict[str, Any] = {"base": 100}
    try:
        outcome, sink, run = run_cell(kube, ALL_REDUCE, user_ns, image=TORCH_IMAGE, gpus=2, ranks=ONE_RANK_EACH,
                                      timeout=600)
    finally:
        neighbour.join()
    assert outcome.status == "ok", (outcome.error, sink.notices)
    retry = [n for n in sink.notices if "retrying the run once on west" in n]
    assert retry and "east cannot schedule the pod" in retry[0] and "nvidia.com/gpu" in retry[0], sink.notices
    after = sink.notices[sink.notices.index(retry[0]) + 1:]
    assert sorted(placed_on(after)) == ["west-gpu", "west-gpu"], sink.notices
    assert sorted(sink.text.splitlines()) == [f"[rank {r}] rank {r} of 2: sum 3" for r in range(2)]
    assert user_ns["result"] == (0, 103)


def test_a_job_pinned_to_its_donor_gets_the_schedulers_reason_and_is_not_moved(
        kube: KubernetesBackend, origin: Any, core: Any, namespace: str) -> None:
    neighbour = neighbour_takes_east_first(origin, core, namespace, gpus=4)
    try:
        outcome, sink, run = run_cell(kube, ALL_REDUCE, {"base": 0}, image=TORCH_IMAGE, gpus=2, ranks=ONE_RANK_EACH,
                                      cluster="east", timeout=600)
    finally:
        neighbour.join()
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Unschedulable", outcome.error
    assert "the scheduler says" in outcome.error.evalue and "nvidia.com/gpu" in outcome.error.evalue
    assert "not moved to another cluster: the cell asked for --cluster east" in outcome.error.evalue
    assert not any("retrying" in n for n in sink.notices), sink.notices
    assert "west-gpu" not in placed_on(sink.notices)


def test_a_spread_job_that_no_other_donor_can_take_fails_with_the_schedulers_reason(
        kube: KubernetesBackend, origin: Any, core: Any, namespace: str) -> None:
    # 2 pods x 4 GPUs on east and west; the neighbour leaves east 2, so one pod runs on west and waits, the
    # other fits nowhere; the retry would have to avoid both donors, and there is no third
    neighbour = neighbour_takes_east_first(origin, core, namespace, gpus=4)
    try:
        outcome, sink, run = run_cell(kube, ALL_REDUCE, {"base": 0}, image=TORCH_IMAGE, gpus=4,
                                      ranks=Ranks(nodes=2, procs_per_node=1, spread=True), timeout=600)
    finally:
        neighbour.join()
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Unschedulable", outcome.error
    assert "the scheduler says" in outcome.error.evalue
    assert "the Job was not moved to another cluster: no cluster has 8 free" in outcome.error.evalue
    assert not any("retrying" in n for n in sink.notices), sink.notices


def test_with_queueing_on_a_job_is_never_moved_by_the_kernel_nor_spread(api_client: Any, namespace: str) -> None:
    # Kueue's waitForPodsReady requeues a Job whose pods do not start; the retry elsewhere is refused first
    from gpu_offload.engine.backends.kube.plan import PodOrder

    backend = KubernetesBackend(settings(namespace, queue="gpus"), api_client)
    try:
        order = PodOrder("run-q", "nonce", RunRequest(gpus=2, image=TORCH_IMAGE, ranks=ONE_RANK_EACH), b"x")
        with pytest.raises(OffloadUsageError, match="queueing through Kueue is on .*does not move the pod itself"):
            backend.launcher.launch(order, frozenset({"east"}))
        # a LocalQueue the kernel found (not named in GPU_OFFLOAD_QUEUE, which the magic checks) refuses --spread
        spread = Ranks(nodes=2, procs_per_node=1, spread=True)
        with pytest.raises(OffloadUsageError, match=r"^Nothing was launched: --spread: queueing is on \(LocalQueue "
                                                    r"gpus\).*Leave out --spread"):
            backend.launcher.launch(dataclasses.replace(order, placement=RunRequest(gpus=2, image=TORCH_IMAGE,
                                                                                    ranks=spread)))
    finally:
        backend.close()
    assert everything_left(api_client, namespace) == []
