"""NamespaceOffloading status reading (pure) and ensure_offloading through the sandbox origin."""

from __future__ import annotations

import uuid

import kubernetes
import pytest
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.errors import OffloadingMissing, OffloadingNotReady
from gpu_offload.liqo_peering.offloading import describe_not_ready, offloading_state


def nso(phase: str | None, ready: dict[str, str], generation: int = 1, observed: int = 1) -> dict:
    status = {"observedGeneration": observed, "remoteNamespacesConditions": {
        cid: [{"type": "Ready", "status": s, "message": f"{cid} says {s}"}] for cid, s in ready.items()}}
    if phase:
        status["offloadingPhase"] = phase
    return {"metadata": {"name": "offloading", "namespace": "team", "generation": generation}, "status": status}


def test_state_ready_only_for_the_wanted_clusters() -> None:
    assert offloading_state(nso("Ready", {"a": "True"}), ["a"]).ready
    some = nso("SomeFailed", {"a": "True", "b": "False"})
    assert offloading_state(some, ["a"]).ready
    state = offloading_state(some, ["b"])
    assert (state.ready, state.failed, state.detail) == (False, False, "b (b says False)")
    assert offloading_state(nso("Ready", {"a": "True"}), ["c"]).detail == "c (not selected)"


def test_a_remote_namespaces_condition_is_shown_on_one_printable_line() -> None:
    state = offloading_state(nso("SomeFailed", {"a": "False\x1b[2J\nforged"}), ["a"])
    assert state.detail == "a (a says False [2J forged)"


def test_a_stale_status_is_not_trusted_and_failed_phases_stop_the_wait() -> None:
    stale = offloading_state(nso("Ready", {"a": "True"}, generation=2, observed=1), ["a"])
    assert (stale.ready, stale.phase) == (False, "(not reconciled yet)")
    failed = offloading_state(nso("NoClusterSelected", {}), ["a"])
    assert failed.failed and not failed.ready
    text = describe_not_ready("team", failed, 30)
    assert text.startswith("NamespaceOffloading team/offloading is in phase NoClusterSelected, remote namespace missing on a")
    assert "gpu-offload clusters" in text
    assert "after 5s; Liqo is still working" in describe_not_ready("team", offloading_state(nso("InProgress", {}), ["a"]), 5)


@pytest.fixture(scope="module")
def client(origin):
    api_client = origin.sandbox.api_client()
    yield LiqoClient(api_client, request_timeout=30)
    api_client.close()


@pytest.fixture
def namespace(client):
    core = kubernetes.client.CoreV1Api(client.api_client)
    name = f"team-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def test_creates_then_widens_without_dropping_or_remapping(client, namespace) -> None:
    created = client.ensure_offloading(namespace, ["donor-1"])
    assert created["status"]["offloadingPhase"] == "Ready"
    assert created["spec"]["podOffloadingStrategy"] == "Local"  # only pods placed by the project leave
    mapping = created["spec"].get("namespaceMappingStrategy")
    again = client.ensure_offloading(namespace, ["donor-1"])
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]  # nothing to change
    widened = client.ensure_offloading(namespace, ["donor-2"])
    terms = widened["spec"]["clusterSelector"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1]["values"] for t in terms] == [["donor-1"], ["donor-2"]]
    assert widened["spec"].get("namespaceMappingStrategy") == mapping
    assert set(widened["status"]["remoteNamespacesConditions"]) == {"donor-1", "donor-2"}


def test_absent_and_not_ours_to_create_says_who_must_act(client, namespace) -> None:
    with pytest.raises(OffloadingMissing, match=f"namespace {namespace} is not offloaded.*ask your JupyterHub admin"):
        client.ensure_offloading(namespace, ["donor-1"], create=False)
    assert client.read_offloading(namespace) is None  # nothing half-made


def test_a_cluster_nobody_offers_fails_naming_the_phase(client, namespace) -> None:
    with pytest.raises(OffloadingNotReady, match=r"is in phase NoClusterSelected, remote namespace missing on donor-9"):
        client.ensure_offloading(namespace, ["donor-9"], timeout=30)
