"""Where a distributed run's pods go on the kubernetes backend, through the sandbox with the real engine and
runner: all on one donor unless ``--spread``; with it, on the donors that together have room (the ranks still
meet at rank 0's Service). Every test leaves no Job, pod, Service or Secret.

Two donors: "east" has the most free GPUs (6), "west" 4; placement's default (most free) picks east first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.magics.backends.base import Ranks, RunRequest
from gpu_offload.magics.backends.kube.backend import KubernetesBackend
from gpu_offload.magics.errors import OffloadUsageError
from gpu_offload.sandbox import liqo
from gpu_offload.sandbox.fixtures import origin_fixture, wait_until

from .conftest import IMAGE_MAP, SHARED, backend_with_neighbours, settings
from .helpers import run_cell
from .test_distributed import ALL_REDUCE, TORCH_IMAGE, everything_left

origin = origin_fixture(
    SHARED / "liqo-crds",
    donors=(liqo.Donor("east", 6, "A100", "2.00"), liqo.Donor("west", 4, "A100", "2.00")),
    image_map=IMAGE_MAP,
)
ONE_RANK_EACH = Ranks(nodes=2, procs_per_node=1)


@pytest.fixture(scope="module")
def api_client(origin: Any) -> Iterator[Any]:
    client = origin.sandbox.api_client()
    yield client
    client.close()


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


def test_with_queueing_on_spread_is_refused_even_when_the_queue_was_found(api_client: Any, namespace: str) -> None:
    from gpu_offload.magics.backends.kube.run import PodOrder

    backend = KubernetesBackend(settings(namespace, queue="gpus"), api_client)
    try:
        order = PodOrder("run-q", "nonce", RunRequest(gpus=2, image=TORCH_IMAGE, ranks=ONE_RANK_EACH), b"x")
        # a LocalQueue the kernel found (not named in GPU_OFFLOAD_QUEUE, which the magic checks) refuses --spread
        spread = Ranks(nodes=2, procs_per_node=1, spread=True)
        with pytest.raises(OffloadUsageError, match=r"^Nothing was launched: --spread: queueing is on \(LocalQueue "
                                                    r"gpus\).*Leave out --spread"):
            backend.launcher.launch_job(order, spread)
    finally:
        backend.close()
    assert everything_left(api_client, namespace) == []
