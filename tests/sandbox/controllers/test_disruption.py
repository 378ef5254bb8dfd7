"""The disruption controller's status of a PodDisruptionBudget, on literal pods (the same status real
kube-controller-manager 1.35 writes, checked against it in tests/engine/kube/test_eviction_api.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from gpu_offload.sandbox.controllers.disruption import budget_status

AT = datetime(2026, 11, 28, 8, 0, tzinfo=timezone.utc)


def pod(name: str, ready: bool = True, deleting: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {"app": "held"} if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T07:59:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def budget(spec: dict[str, Any], disrupted: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "held", "namespace": "ns", "generation": 2},
            "spec": {"selector": {"matchLabels": {"app": "held"}}, **spec},
            "status": {"disruptedPods": disrupted} if disrupted else {}}


def counts(status: dict[str, Any]) -> tuple[int, int, int, int]:
    return (status["expectedPods"], status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"])


def test_healthy_pods_above_min_available_may_be_disrupted() -> None:
    pods = [pod("a"), pod("b"), pod("c", ready=False), pod("d", deleting=True), pod("other", labels={"app": "x"})]
    status, wake = budget_status(budget({"minAvailable": 1}), pods, AT)
    assert counts(status) == (4, 2, 1, 1) and wake is None and status["observedGeneration"] == 2
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("DisruptionAllowed", "True", "SufficientPods")]


def test_a_pod_an_eviction_recorded_is_not_healthy_until_it_goes_or_two_minutes_pass() -> None:
    recent = (AT - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status, wake = budget_status(budget({"minAvailable": 1}, {"a": recent}), [pod("a"), pod("b")], AT)
    assert counts(status) == (2, 1, 1, 0) and status["disruptedPods"] == {"a": recent} and wake == 90.0
    assert status["conditions"][0]["reason"] == "InsufficientPods"
    old = (AT - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status, wake = budget_status(budget({"minAvailable": 1}, {"a": old, "gone": recent}), [pod("a"), pod("b")], AT)
    assert counts(status) == (2, 2, 1, 1) and "disruptedPods" not in status and wake is None


def test_an_empty_selector_and_a_budget_without_an_integer_min_available_allow_nothing() -> None:
    empty = budget({"minAvailable": 0})
    empty["spec"]["selector"] = {}
    assert counts(budget_status(empty, [pod("a")], AT)[0]) == (0, 0, 0, 0)
    # pods without a scalable controller: the real controller expects none of them, so nothing may go (real
    # kube-controller-manager 1.35.4 wrote exactly these counts for two bare Ready pods, 2026-11-28)
    for spec in ({"maxUnavailable": 1}, {"minAvailable": "50%"}):
        assert counts(budget_status(budget(spec), [pod("a"), pod("b")], AT)[0]) == (0, 2, 0, 0)
