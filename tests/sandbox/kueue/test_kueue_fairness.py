"""The fairness scenario of issue 15 through the sandbox's Kueue, with pods that really run: user ann submits
40 one-GPU pods at once and fills the pool; bob and cat submit 4 each a little later. With Admission Fair
Sharing the lighter users' pods are admitted before ann's backlog drains, and over the contended period
the three share the pool evenly. Time is logical (``StepPool``): a pod holds its GPU until released, the
oldest first, so the test asserts the order of admission, never how long anything took."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import pooled_as, wait_until
from gpu_offload.sandbox.kueue.pooled import kueue_origin_key
from gpu_offload.sandbox.kueue.scenario import (
    QUEUE,
    StepPool,
    held,
    held_pod,
    jain,
    kueue_pool,
    user_namespaces,
    workload_count,
)
from gpu_offload.sandbox.liqo import seed as liqo

from ...origins import QUEUED

USERS = ("ann", "bob", "cat")


TWO_DONORS = QUEUED.with_donors(liqo.donors(2, gpus=2))
pooled = TWO_DONORS.fixture(name="pooled")  # the session's Kueue origin of default options, two donors of 2 A100


@pytest.fixture
@pooled_as(kueue_origin_key(**TWO_DONORS.pool_options()))
def origin(pooled: Any) -> Iterator[Any]:
    yield pooled.sandbox
    # the origin is shared: the users' namespaces go, and with them ann's backlog, still held
    with pooled.sandbox.api_client() as client:
        for user in USERS:
            kubernetes.client.CoreV1Api(client).delete_namespace(user)


def test_light_users_are_admitted_before_a_heavy_backlog_drains_and_share_evenly(origin):
    client = origin.api_client()
    core = kubernetes.client.CoreV1Api(client)
    user_namespaces(client, USERS)
    kueue_pool(client, USERS, {"donor-1": 2, "donor-2": 2},
               admissionScope={"admissionMode": "UsageBasedAdmissionFairSharing"})
    pool = StepPool(core, size=4)
    for i in range(40):
        core.create_namespaced_pod("ann", held_pod(f"ann-{i:02d}", "ann", QUEUE))
    first = pool.settle(lambda: workload_count(client, USERS) == 40)
    assert {h.user for h in first} == {"ann"} and len(first) == 4  # ann alone fills the pool
    for user in ("bob", "cat"):
        for i in range(4):
            core.create_namespaced_pod(user, held_pod(f"{user}-{i}", user, QUEUE))
    wait_until(lambda: workload_count(client, USERS) == 48, "every pod's Workload")  # queued before a GPU frees
    light = {("bob", f"bob-{i}") for i in range(4)} | {("cat", f"cat-{i}") for i in range(4)}
    order: list[str] = []
    while light - {(h.namespace, h.name) for h in pool.holds if h.ended is not None}:
        pool.release_oldest()
        order += [h.name for h in pool.settle()]
    # each freed GPU went to bob or cat until both had all their pods running; ann's backlog waited
    assert sorted(order[:8]) == sorted(name for _, name in light), order
    assert all(name.startswith("ann-") for name in order[8:]), order
    assert len(pool.by_user()["ann"]) < 40  # ann's backlog has not drained
    split = held(pool.holds, 0, pool.step)  # GPU-steps from bob's and cat's arrival until their last pod ended
    assert jain(split[u] for u in USERS) >= 0.9, split
    client.close()
