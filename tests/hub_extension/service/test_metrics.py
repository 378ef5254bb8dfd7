"""The service's Prometheus metrics, scraped through the hub's proxy as Prometheus would, against the sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.config import HubConfig, parse_config
from gpu_offload.hub_extension.service.actions import Cordon, SliceRequest
from gpu_offload.hub_extension.service.metrics import PREFIX, HubMetrics, run_reason
from gpu_offload.hub_extension.service.operations import ClusterFacts, Operations
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import TESTER_TOKEN, free_port, http, offloaded_namespace

BOUNDED_LABELS = {"user", "cluster", "model", "outcome", "reason", "verb", "le"}  # le: a histogram bucket's bound


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _scrape(hub: Any, user: str = "vera") -> str:
    answer = hub.api("GET", "metrics", user)
    assert answer.status == 200, answer.text
    kind = {k.lower(): v for k, v in answer.headers.items()}["content-type"]
    assert kind.startswith("text/plain")  # Prometheus' text format
    return answer.text


def test_metrics_need_a_token_with_a_metrics_or_view_scope(hub: Any) -> None:
    # as JupyterHub's own /metrics: 403, never a login redirect a scraper could not follow
    anonymous = http("GET", f"{hub.service_url}metrics")
    assert anonymous.status == 403 and "read:metrics" in anonymous.text
    assert hub.api("GET", "metrics", "alice").status == 403  # a plain user
    assert "gpu_offload_gpus_free" in _scrape(hub, "vera") and "gpu_offload_gpus_free" in _scrape(hub, "admin")
    minted = http("POST", f"{hub.url}hub/api/users/admin/tokens", TESTER_TOKEN,
                  {"note": "prometheus", "expires_in": 600, "scopes": ["read:metrics"]})
    assert minted.status == 201, minted.text
    scraper = http("GET", f"{hub.service_url}metrics", minted.json()["token"])
    assert scraper.status == 200 and "gpu_offload_donor_healthy" in scraper.text


def test_gpu_gauges_match_the_inventory_the_pages_show(hub: Any) -> None:
    samples = _samples(_scrape(hub))
    rows = {r["cluster_id"]: r for r in hub.api("GET", "api/admin/clusters", "vera").json()["clusters"]}
    assert rows
    for cluster, row in rows.items():
        for name, key in (("gpus", "gpus_total"), ("gpus_free", "gpus_free"), ("gpus_in_use", "gpus_in_use")):
            mine = [v for (n, labels), v in samples.items()
                    if n == f"{PREFIX}{name}" and ("cluster", cluster) in labels]
            assert mine and sum(mine) == row[key], (cluster, name, mine, row)
        assert samples[(f"{PREFIX}donor_healthy", (("cluster", cluster),))] == (row["health"] == "healthy")


def test_a_finished_run_adds_its_gpu_seconds_by_user_cluster_and_model(hub: Any, origin: RunningOrigin) -> None:
    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    user = "metered-user"
    pod = {"metadata": {"name": "gpuo-m", "labels": {"gpu-offload.io/managed-by": "gpu-offload",
                                                     "gpu-offload.io/user": user},
                        "annotations": {"gpu-offload.io/user": user}},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "runner", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(2)"],
               "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    try:
        before = _samples(_scrape(hub))
        assert not [k for k in before if ("user", user) in k[1]]
        core.create_namespaced_pod(ns, pod)

        def recorded() -> list[Any]:
            usage = hub.api("GET", "api/admin/usage", "vera").json()["usage"]
            return [u for u in usage if u["user"] == user]

        (usage,) = wait_until(recorded, "the run to be recorded")
        after = _samples(_scrape(hub))
        mine = {k: v for k, v in after.items() if k[0] == f"{PREFIX}gpu_seconds_total" and ("user", user) in k[1]}
        ((name, labels), seconds), = mine.items()
        assert dict(labels)["cluster"] == usage["cluster_id"] and dict(labels)["model"]
        # 2 GPUs for a 2-second sleep: at least 2 GPU-seconds, and what the usage API says to the second
        assert 2 * 1 <= seconds <= 2 * 60 and seconds == pytest.approx(usage["gpu_hours"] * 3600, abs=0.01)
        # and its cost at the donor's price, as the usage API has it (both sandbox donors are priced)
        assert usage["cost"] > 0 and after[(f"{PREFIX}cost_total", labels)] == pytest.approx(usage["cost"])
        runs = f"{PREFIX}runs_total"
        done = (runs, (("outcome", "Succeeded"), ("reason", "Completed")))
        assert after[done] == before.get(done, 0.0) + 1
        for (family, labels), _ in after.items():  # bounded labels only: no pod name, no uid
            assert family.startswith(PREFIX)
            assert {k for k, _ in labels} <= BOUNDED_LABELS
            assert not any(value in ("gpuo-m", ns) for _, value in labels)
    finally:
        core.delete_namespace(ns)
        client.close()


def _inventory() -> Inventory:
    nodes = (VirtualNodeRecord("d1-a", "d1", 4, 4, 1, model="H100"),
             VirtualNodeRecord("d1-b", "d1", 2, 2, 0, model="H100", cordoned=True),
             VirtualNodeRecord("d1-c", "d1", 8, 8, 0))
    return Inventory((ClusterRecord("d1", "d1", "provider", "healthy", virtual_nodes=nodes),
                      ClusterRecord("d2", "d2", "provider", "down", "networking lost")))


def test_every_family_is_prefixed_and_labelled_from_bounded_sets() -> None:
    metrics = HubMetrics(_inventory)
    metrics.record_run("alice", "d1", None, 30.0, "Failed", {"status": {"containerStatuses": [
        {"state": {"terminated": {"reason": "OOMKilled"}}}]}}, 0.05)
    metrics.api_error("patch")
    metrics.api_error("PATCH /apis/x/run-7f3a9")  # never a free-form label value
    families = list(metrics.registry.collect())
    assert {f.name for f in families} == {f"{PREFIX}{n}" for n in
                                          ("gpu_seconds", "cost", "runs", "api_errors", "gpus", "gpus_free",
                                           "gpus_in_use", "donor_healthy", "placement_seconds", "queue_wait_seconds",
                                           "preemptions")}
    for family in families:
        assert family.name.startswith(PREFIX)
        for sample in family.samples:
            assert set(sample.labels) <= BOUNDED_LABELS, (sample.name, sample.labels)
    value = metrics.registry.get_sample_value
    assert value(f"{PREFIX}gpu_seconds_total", {"user": "alice", "cluster": "d1", "model": "unlabelled"}) == 30.0
    assert value(f"{PREFIX}cost_total", {"user": "alice", "cluster": "d1", "model": "unlabelled"}) == 0.05
    # the cordoned node's GPUs count in the total, not in what is free
    assert value(f"{PREFIX}gpus", {"cluster": "d1", "model": "H100"}) == 6
    assert value(f"{PREFIX}gpus_free", {"cluster": "d1", "model": "H100"}) == 3
    assert value(f"{PREFIX}gpus_in_use", {"cluster": "d1", "model": "H100"}) == 1
    assert value(f"{PREFIX}donor_healthy", {"cluster": "d2"}) == 0
    assert value(f"{PREFIX}api_errors_total", {"verb": "patch"}) == 1
    assert value(f"{PREFIX}api_errors_total", {"verb": "other"}) == 1


def test_failed_api_requests_of_admin_actions_are_counted_by_verb(tmp_path: Path) -> None:
    metrics = HubMetrics(_inventory)
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    # a real client whose API server does not answer (a closed port): every request fails
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    configuration.retries = False
    client = kubernetes.client.ApiClient(configuration)
    operations = Operations(HubConfig(tenant_namespaces=("liqo-tenant-d1",)), client, store, metrics.api_error)
    try:
        facts = ClusterFacts("origin", {"d1": "ok"})
        assert not operations.apply(SliceRequest("d1", 2, "d1-gpu"), "admin", facts).ok
        assert not operations.apply(Cordon("d1", "d1-a", True), "admin", facts).ok
        # refused before any request: nothing is counted
        assert not operations.apply(Cordon("d9", "d9-a", True), "admin", facts).ok
        value = metrics.registry.get_sample_value
        assert value(f"{PREFIX}api_errors_total", {"verb": "get"}) == 1
        assert value(f"{PREFIX}api_errors_total", {"verb": "patch"}) == 1
        assert value(f"{PREFIX}api_errors_total", {"verb": "create"}) is None
    finally:
        client.close()
        store.close()


def test_run_reasons_come_from_a_bounded_set() -> None:
    def pod(reason: str | None = None, container: str | None = None) -> dict[str, Any]:
        state = {"terminated": {"reason": container}} if container else {}
        return {"status": {**({"reason": reason} if reason else {}), "containerStatuses": [{"state": state}]}}

    assert run_reason(pod("Evicted", "Error")) == "Evicted"
    assert run_reason(pod(container="OOMKilled")) == "OOMKilled"
    assert run_reason(pod()) == "none"
    assert run_reason(pod("run-7f3a9 exceeded its budget")) == "other"  # free text never becomes a label value


def test_metrics_are_open_only_when_the_chart_says_so_in_words() -> None:
    assert parse_config({}).metrics_open is False
    assert parse_config({"metrics": {"open": True}}).metrics_open is True
    with pytest.raises(InvalidRequest, match=r"metrics.open='yes' must be true or false"):
        parse_config({"metrics": {"open": "yes"}})


def _timed_pod(created: str, bound: str | None, queue: str | None = None,
               stopped_because: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": bound}] if bound else [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    if stopped_because:  # as Kueue stops the pod of an evicted Workload, before deleting it
        conditions.append({"type": "TerminationTarget", "status": "True", "lastTransitionTime": bound,
                           "reason": f"WorkloadEvictedDueTo{stopped_because}", "message": "..."})
    return {"metadata": {"creationTimestamp": created, "labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}},
            "status": {"conditions": conditions}}


def test_waits_are_split_into_placement_and_queue_and_preemptions_are_counted_per_user() -> None:
    metrics = HubMetrics(_inventory)
    value = metrics.registry.get_sample_value
    metrics.record_run("alice", "d1", "H100", 60.0, "Succeeded", _timed_pod("2026-11-23T10:00:00Z", "2026-11-23T10:00:03Z"))
    metrics.record_run("bob", "d1", "H100", 60.0, "Deleted",
                       _timed_pod("2026-11-23T10:00:00Z", "2026-11-23T10:04:00Z", "gpu-offload", "Preempted"))
    metrics.record_run("carol", "d1", "H100", 60.0, "Deleted",
                       _timed_pod("2026-11-23T10:00:00Z", "2026-11-23T10:00:20Z", "gpu-offload", "PodsReadyTimeout"))
    metrics.record_run("dave", "d1", "H100", 0.0, "Deleted", _timed_pod("2026-11-23T10:00:00Z", None, "gpu-offload"))
    # 3 s of placement for the pod outside Kueue, and none of its wait counted as queueing
    assert value(f"{PREFIX}placement_seconds_count", {"cluster": "d1"}) == 1
    assert value(f"{PREFIX}placement_seconds_sum", {"cluster": "d1"}) == 3
    # the two queued pods that were bound: 240 s and 20 s; the one never bound has no wait to report
    assert value(f"{PREFIX}queue_wait_seconds_count", {"cluster": "d1"}) == 2
    assert value(f"{PREFIX}queue_wait_seconds_sum", {"cluster": "d1"}) == 260
    assert value(f"{PREFIX}queue_wait_seconds_bucket", {"cluster": "d1", "le": "30.0"}) == 1
    # only the preemption counts as one: an eviction for pods-ready timeout is a requeue, not a preemption
    assert value(f"{PREFIX}preemptions_total", {"user": "bob", "cluster": "d1"}) == 1
    assert value(f"{PREFIX}preemptions_total", {"user": "carol", "cluster": "d1"}) is None
    assert value(f"{PREFIX}runs_total", {"outcome": "Deleted", "reason": "Preempted"}) == 1


def test_no_created_series_and_per_user_series_can_be_dropped_for_large_hubs() -> None:
    from prometheus_client import generate_latest

    run = {"status": {"containerStatuses": [{"state": {"terminated": {"reason": "Preempted"}}}]}}
    per_user = HubMetrics(_inventory)
    per_user.record_run("alice", "d1", "H100", 30.0, "Failed", run, 0.5)
    text = generate_latest(per_user.registry).decode()
    assert "_created" not in text  # no <name>_created series beside each counter
    assert 'user="alice"' in text

    pooled = HubMetrics(_inventory, per_user=False)
    pooled.record_run("alice", "d1", "H100", 30.0, "Failed", run, 0.5)
    pooled.record_run("bob", "d1", "H100", 10.0, "Failed", run, 0.25)
    text = generate_latest(pooled.registry).decode()
    assert "user=" not in text and "_created" not in text
    value = pooled.registry.get_sample_value
    assert value(f"{PREFIX}gpu_seconds_total", {"cluster": "d1", "model": "H100"}) == 40.0
    assert value(f"{PREFIX}cost_total", {"cluster": "d1", "model": "H100"}) == 0.75
    assert value(f"{PREFIX}preemptions_total", {"cluster": "d1"}) == 2


def test_the_charts_per_user_series_value_reaches_the_service() -> None:
    from gpu_offload.hub_extension.config import parse_config

    assert parse_config({}).metrics_per_user is True
    assert parse_config({"metrics": {"perUserSeries": False}}).metrics_per_user is False
    with pytest.raises(ValueError, match=r"metrics.perUserSeries='no' must be true or false"):
        parse_config({"metrics": {"perUserSeries": "no"}})
