"""A cluster whose scheduler cannot take the pod although the inventory showed free GPUs is retried once
elsewhere; a cell pinned to that cluster fails with the scheduler's reason instead.

Placement counts GPUs only; here the donor with the most free GPUs has nodes too small for the memory the
cell asks for, which is what the scheduler, not the inventory, finds out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.magics.backends.kube.backend import KubernetesBackend
from gpu_offload.magics.backends.kube.explain import MEMORY_ENV
from gpu_offload.magics.errors import RemoteError
from gpu_offload.sandbox import liqo
from gpu_offload.sandbox.fixtures import origin_fixture, wait_until

from .conftest import IMAGE_MAP, SHARED, leftovers, settings
from .helpers import run_cell

origin = origin_fixture(
    SHARED / "liqo-crds",
    donors=(liqo.Donor("roomy", 4, "A100", "2.00", memory="256Gi"),
            liqo.Donor("small", 8, "L4", "0.80", memory="16Gi")),
    image_map=IMAGE_MAP,
)


@pytest.fixture(scope="module")
def api_client(origin: Any) -> Iterator[Any]:
    client = origin.sandbox.api_client()
    yield client
    client.close()


@pytest.fixture()
def kube(api_client: Any, namespace: str, core: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesBackend]:
    monkeypatch.setenv(MEMORY_ENV, "64Gi")  # more than any node of "small" has
    backend = KubernetesBackend(settings(namespace), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)


def test_a_cluster_that_cannot_schedule_the_pod_is_retried_once_on_another(kube: KubernetesBackend) -> None:
    outcome, sink, run = run_cell(kube, "print('ran')", {})
    assert outcome.status == "ok", outcome.error
    assert "ran" in sink.text
    retry = [n for n in sink.notices if "retrying once on roomy" in n]
    assert retry and "small cannot schedule the pod" in retry[0] and "memory" in retry[0].lower(), sink.notices
    assert run.current.ctx.cluster == "roomy"


def test_a_cell_pinned_to_the_cluster_gets_the_schedulers_reason_and_no_retry(kube: KubernetesBackend) -> None:
    outcome, sink, run = run_cell(kube, "print('never')", {}, cluster="small")
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Unschedulable", outcome.error
    assert "the scheduler says" in outcome.error.evalue and "--cluster small" in outcome.error.evalue
    assert not any("retrying" in n for n in sink.notices)
    assert "never" not in sink.text and run.current.ctx.cluster == "small"


def test_a_session_whose_pod_cannot_be_scheduled_starts_on_another_cluster_and_keeps_state(
        kube: KubernetesBackend) -> None:
    namespace: dict[str, Any] = {}
    outcome, sink, _ = run_cell(kube, "x = 41\nprint('first')", namespace, session="train")
    assert outcome.status == "ok", outcome.error
    assert "first" in sink.text
    retry = [n for n in sink.notices if "retrying once on roomy" in n]
    assert retry and "before the session started" in retry[0], sink.notices
    assert "roomy" in kube.sessions()[0].where
    outcome, sink, _ = run_cell(kube, "print(x + 1)", namespace, session="train")
    assert outcome.status == "ok", outcome.error
    assert "42" in sink.text and not sink.notices


def test_a_pinned_session_is_not_moved(kube: KubernetesBackend) -> None:
    outcome, sink, _ = run_cell(kube, "print('never')", {}, session="pinned", cluster="small")
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Unschedulable", outcome.error
    assert "--cluster small" in outcome.error.evalue and not any("retrying" in n for n in sink.notices)
