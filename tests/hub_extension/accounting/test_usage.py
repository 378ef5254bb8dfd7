"""The usage recorder: runner pods metered when they end, kept across restarts, never counted twice."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.accounting.usage import billed_user, finished_run, seen_running
from gpu_offload.hub_extension.config import HubConfig
from gpu_offload.hub_extension.service.state import HubState
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..conftest import offloaded_namespace

T0 = datetime(2026, 11, 22, 1, 0, 0, tzinfo=timezone.utc)


def _pod(phase: str, gpus: int = 2, node: str = "donor-1-gpu", finished: str | None = "2026-11-22T01:30:00Z"
         ) -> dict[str, Any]:
    terminated = {"startedAt": "2026-11-22T01:00:05Z", **({"finishedAt": finished} if finished else {})}
    state = {"terminated": terminated} if phase in ("Succeeded", "Failed") else {"running": {"startedAt": "2026-11-22T01:00:05Z"}}
    return {
        "metadata": {"name": "gpuo-r1", "namespace": "jhub-alice", "uid": "uid-1", "creationTimestamp": "2026-11-22T01:00:00Z",
                     "labels": {"gpu-offload.io/user": "alice-3f2a"}, "annotations": {"gpu-offload.io/user": "alice@example.org"}},
        "spec": {"nodeName": node, "containers": [{"name": "runner", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase, "startTime": "2026-11-22T01:00:00Z", "containerStatuses": [{"state": state}]},
    }


def test_a_finished_pod_is_metered_from_when_the_meter_saw_it_run_to_when_it_saw_it_end() -> None:
    seen_running, seen_ended = T0 + timedelta(seconds=5), T0 + timedelta(minutes=30, seconds=5)
    run = finished_run(_pod("Succeeded"), "MODIFIED", {"donor-1-gpu": "donor-1"}, seen_ended, running_seen=seen_running)
    assert run is not None
    assert (run.user, run.cluster_id, run.gpus, run.phase) == ("alice@example.org", "donor-1", 2, "Succeeded")
    assert (run.started, run.ended, run.gpu_seconds) == (seen_running, seen_ended, 2 * 30 * 60)


@pytest.mark.parametrize("forged", [
    {"startTime": "2016-11-22T01:00:00Z", "finishedAt": "2036-11-22T01:00:00Z"},
    {"startTime": "2016-11-22T01:00:00Z", "finishedAt": None},
    {"startTime": "the donor's words", "finishedAt": "1970-01-01T00:00:00Z"},
], ids=["ten years before and after", "started ten years ago", "not a time"])
def test_the_donors_status_times_decide_nothing(forged: dict[str, Any]) -> None:
    # Liqo copies the donor's pod status verbatim: a 20-second run once came back as 87,600 GPU-hours
    pod = _pod("Succeeded", gpus=1)
    pod["status"]["startTime"] = forged["startTime"]
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    state["startedAt"] = forged["startTime"]
    if forged["finishedAt"]:
        state["finishedAt"] = forged["finishedAt"]
    else:
        del state["finishedAt"]
    # created at T0 and seen ended 20 s later (the origin's clock): 20 GPU-seconds, whatever the donor says
    run = finished_run(pod, "MODIFIED", {"donor-1-gpu": "donor-1"}, T0 + timedelta(seconds=20))
    assert run is not None and run.gpu_seconds == 20
    # seen running 5 s after its creation (it waited for its image): from then on
    run = finished_run(pod, "MODIFIED", {"donor-1-gpu": "donor-1"}, T0 + timedelta(seconds=20),
                       running_seen=T0 + timedelta(seconds=5))
    assert run is not None and run.gpu_seconds == 15


def test_a_pod_deleted_while_running_is_metered_until_its_deletion() -> None:
    now = T0 + timedelta(minutes=10)
    run = finished_run(_pod("Running", finished=None), "DELETED", {"donor-1-gpu": "donor-1"}, now)
    assert run is not None and run.phase == "Deleted" and run.gpu_seconds == 2 * 600


def test_running_local_or_gpu_less_pods_are_not_runs() -> None:
    clusters = {"donor-1-gpu": "donor-1"}
    assert finished_run(_pod("Running"), "MODIFIED", clusters, T0) is None
    assert finished_run(_pod("Succeeded", node="local-node"), "MODIFIED", clusters, T0) is None
    assert finished_run(_pod("Succeeded", gpus=0), "MODIFIED", clusters, T0) is None


def test_the_store_counts_a_pod_once_and_sums_per_user_and_cluster(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/usage.sqlite")
    run = finished_run(_pod("Succeeded"), "MODIFIED", {"donor-1-gpu": "donor-1"}, T0 + timedelta(minutes=30))
    assert run is not None
    assert store.record_run(run) is True
    assert store.record_run(run) is False  # the DELETED event of the same pod
    store.close()
    reopened = Store(f"sqlite:///{tmp_path}/usage.sqlite")  # a restarted service
    assert reopened.record_run(run) is False
    (total,) = reopened.totals()
    assert (total.user, total.cluster_id, total.runs) == ("alice@example.org", "donor-1", 1)
    assert total.gpu_hours == pytest.approx(1.0)
    assert [r.pod_uid for r in reopened.runs("alice@example.org")] == ["uid-1"]
    reopened.close()


def test_a_run_kueue_preempted_says_so_in_its_record_and_in_the_totals(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path}/usage.sqlite"
    old = sa.create_engine(url)  # a database from before the column existed, with one run in it
    with old.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE gpu_offload_runs (pod_uid VARCHAR(64) PRIMARY KEY, namespace VARCHAR(253) NOT NULL, "
            "pod VARCHAR(253) NOT NULL, user VARCHAR(255) NOT NULL, cluster_id VARCHAR(253) NOT NULL, "
            "node VARCHAR(253) NOT NULL, gpus INTEGER NOT NULL, started DATETIME NOT NULL, ended DATETIME NOT NULL, "
            "phase VARCHAR(16) NOT NULL, gpu_seconds FLOAT NOT NULL)"))
        conn.execute(sa.text("INSERT INTO gpu_offload_runs VALUES ('uid-0', 'jhub-alice', 'gpuo-r0', "
                             "'alice@example.org', 'donor-1', 'donor-1-gpu', 1, '2026-11-22 00:00:00', "
                             "'2026-11-22 01:00:00', 'Succeeded', 3600.0)"))
    old.dispose()
    pod = _pod("Failed")
    pod["status"]["conditions"] = [{"type": "TerminationTarget", "status": "True",
                                    "reason": "WorkloadEvictedDueToPreempted", "message": "Preempted to accommodate"}]
    run = finished_run(pod, "DELETED", {"donor-1-gpu": "donor-1"}, T0)
    assert run is not None and run.preempted
    assert not finished_run(_pod("Failed"), "DELETED", {"donor-1-gpu": "donor-1"}, T0).preempted  # type: ignore[union-attr]
    store = Store(url)
    assert store.record_run(run)
    (total,) = store.totals()
    assert (total.runs, total.preempted) == (2, 1)
    assert [(r.pod, r.preempted) for r in store.runs("alice@example.org")] == [("gpuo-r1", True), ("gpuo-r0", False)]
    store.close()


def _runner_pod(name: str, user: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"gpu-offload.io/managed-by": "gpu-offload",
                                                  "gpu-offload.io/user": user},
                         "annotations": {"gpu-offload.io/user": user}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "runner", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(1)"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_the_service_records_real_runs_once_across_a_restart(origin: RunningOrigin, api_client: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/usage.sqlite"
    core = kubernetes.client.CoreV1Api(api_client)
    ns = offloaded_namespace(api_client)
    state = HubState(HubConfig(), api_client, Store(url)).start()
    try:
        assert state.wait_synced(60)
        core.create_namespaced_pod(ns, _runner_pod("gpuo-a", "alice", 2))
        wait_until(lambda: state.store.totals("alice"), "the finished pod to be recorded")
        # the runner's backend deletes the pod after its run: the DELETED event must not count it again
        core.delete_namespaced_pod("gpuo-a", ns)
        wait_until(lambda: not [p for p in state.pods.objects() if p["metadata"]["name"] == "gpuo-a"],
                   "the deletion to reach the service")
        # a second pod finishes, and stays (not deleted) while the service restarts
        core.create_namespaced_pod(ns, _runner_pod("gpuo-b", "alice", 1))
        wait_until(lambda: state.store.totals("alice") and state.store.totals("alice")[0].runs == 2, "the 2nd run")
    finally:
        state.close()
    restarted = HubState(HubConfig(), api_client, Store(url)).start()  # re-lists gpuo-b, finished: seen again
    try:
        assert restarted.wait_synced(60)
        wait_until(lambda: [p for p in restarted.pods.objects() if p["metadata"]["name"] == "gpuo-b"], "the re-list")
        (total,) = restarted.store.totals("alice")
        assert total.runs == 2 and total.cluster_id in ("donor-1", "donor-2")
        runs = {r.pod: r for r in restarted.store.runs("alice")}
        assert runs["gpuo-a"].gpus == 2 and runs["gpuo-b"].gpus == 1
        assert all(r.gpu_seconds > 0 and r.phase == "Succeeded" for r in runs.values())
        mine = restarted.user_runs("alice")
        assert {r["pod"] for r in mine["finished"]} == {"gpuo-a", "gpuo-b"} and mine["running"] == []
    finally:
        restarted.close()
        core.delete_namespace(ns)


def test_a_pod_held_by_the_meter_ends_at_its_deletion_not_when_the_hub_sees_it() -> None:
    pod = _pod("Running", finished=None)
    pod["metadata"]["deletionTimestamp"] = "2026-11-22T01:20:00Z"
    pod["metadata"]["finalizers"] = ["gpu-offload.io/metered"]
    clusters = {"donor-1-gpu": "donor-1"}
    # the grace period is not over and the runner still runs: not yet
    assert finished_run(pod, "MODIFIED", clusters, T0 + timedelta(minutes=19)) is None
    # the hub comes back hours later: the run ended when it was deleted
    run = finished_run(pod, "ADDED", clusters, T0 + timedelta(hours=6))
    assert run is not None and run.phase == "Deleted" and run.gpu_seconds == 2 * 20 * 60
    stopped = _pod("Failed", finished="2026-11-22T01:10:00Z")
    stopped["metadata"]["deletionTimestamp"] = "2026-11-22T01:20:00Z"
    run = finished_run(stopped, "MODIFIED", clusters, T0 + timedelta(minutes=25))
    assert run is not None and run.gpu_seconds == 2 * 20 * 60  # its deletion came before the meter saw it end
    run = finished_run(stopped, "MODIFIED", clusters, T0 + timedelta(minutes=5))
    assert run is not None and run.gpu_seconds == 2 * 5 * 60  # the donor's own finish time is information only


def test_a_pod_first_seen_stopped_in_its_deletion_was_never_seen_running() -> None:
    pod = _pod("Running", finished=None)
    assert seen_running(pod, "ADDED", T0 + timedelta(minutes=1))
    assert not seen_running(pod, "DELETED", T0 + timedelta(minutes=1))
    pod["metadata"]["deletionTimestamp"] = "2026-11-22T01:20:00Z"
    # in its grace period, its runner still running: it runs
    assert seen_running(pod, "MODIFIED", T0 + timedelta(minutes=19))
    # the hub comes back after the deletion (the status still says Running): it must not start the run now,
    # or the run would start after its end and bill nothing, at the price of the day it came back
    assert not seen_running(pod, "ADDED", T0 + timedelta(hours=6))
    pod["status"]["containerStatuses"] = [{"state": {"terminated": {"exitCode": 137}}}]
    assert not seen_running(pod, "MODIFIED", T0 + timedelta(minutes=19))


def test_a_run_created_and_deleted_while_the_service_was_down_is_metered_when_it_returns(
        origin: RunningOrigin, api_client: Any, tmp_path: Path) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    ns = offloaded_namespace(api_client)
    try:
        # no service runs: a kernel's pod starts, runs, and is deleted; the meter's finalizer holds it
        body = _runner_pod("gpuo-held", "carol", 1)
        body["metadata"]["finalizers"] = ["gpu-offload.io/metered"]
        body["spec"]["containers"][0]["command"] = ["python3", "-c", "import time; time.sleep(300)"]
        core.create_namespaced_pod(ns, body)
        wait_until(lambda: (core.read_namespaced_pod("gpuo-held", ns).status.phase == "Running"), "the run started")
        time.sleep(2.5)  # timestamps have one-second precision: let the run hold its GPU for some seconds
        core.delete_namespaced_pod("gpuo-held", ns, grace_period_seconds=0)
        held = core.read_namespaced_pod("gpuo-held", ns)  # still there: only the meter may let it go
        assert held.metadata.deletion_timestamp is not None
        deleted_at = held.metadata.deletion_timestamp
        state = HubState(HubConfig(), api_client, Store(f"sqlite:///{tmp_path}/usage.sqlite")).start()
        try:
            assert state.wait_synced(60)
            wait_until(lambda: state.store.totals("carol"), "the held run to be recorded")
            (run,) = state.store.runs("carol")
            assert run.pod == "gpuo-held" and run.gpus == 1 and run.gpu_seconds > 0
            assert run.ended <= deleted_at + timedelta(seconds=1)  # not the time the service came back

            def gone() -> bool:
                return not core.list_namespaced_pod(ns, field_selector="metadata.name=gpuo-held").items

            wait_until(gone, "the pod released by the meter")
        finally:
            state.close()
    finally:
        core.delete_namespace(ns)


def _namespace(name: str, owner: str | None, user_namespace: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"} if user_namespace else {}}
    if owner is not None:
        meta["annotations"] = {"gpu-offload.io/user": owner}
    return {"metadata": meta}


def test_the_user_comes_from_the_namespace_not_from_the_pods_claim(caplog: pytest.LogCaptureFixture) -> None:
    forged = _pod("Succeeded")  # claims alice@example.org
    assert billed_user(forged, _namespace("jhub-bob", "bob")) == "bob"
    assert "claims user 'alice@example.org'" in caplog.text and "billed to 'bob'" in caplog.text
    # a user namespace from before the hook wrote its owner bills nobody rather than the claim
    assert billed_user(forged, _namespace("jhub-old", None)) == ""
    # a shared namespace (Metaflow steps): the annotation is all there is
    assert billed_user(forged, _namespace("flows", None, user_namespace=False)) == "alice@example.org"
    assert billed_user(forged, None) == "alice@example.org"


def test_a_forged_annotation_bills_nobody_else(origin: RunningOrigin, api_client: Any, tmp_path: Path) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    ns = offloaded_namespace(api_client)
    core.patch_namespace(ns, {"metadata": {"labels": {"gpu-offload.io/user-namespace": "true"},
                                           "annotations": {"gpu-offload.io/user": "mallory"}}})
    state = HubState(HubConfig(), api_client, Store(f"sqlite:///{tmp_path}/usage.sqlite")).start()
    try:
        assert state.wait_synced(60)
        core.create_namespaced_pod(ns, _runner_pod("gpuo-forged", "victim", 1))
        wait_until(lambda: state.store.totals("mallory"), "the run to be recorded")
        assert state.store.totals("victim") == []
        assert [r.pod for r in state.store.runs("mallory")] == ["gpuo-forged"]
    finally:
        state.close()
        core.delete_namespace(ns)


def test_a_sidecar_holds_its_gpus_for_the_pods_life_and_is_billed_for_them() -> None:
    pod = _pod("Succeeded", gpus=1)
    # a sidecar (an init container that keeps running) with 2 GPUs beside a 1-GPU runner: the scheduler
    # reserves 3 on the node for the whole run; a plain init container runs before, beside the sidecars
    # started before it
    pod["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        {"name": "warm-up", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    ]
    run = finished_run(pod, "MODIFIED", {"donor-1-gpu": "donor-1"}, T0 + timedelta(minutes=30))
    assert run is not None and run.gpus == 3 and run.gpu_seconds == 3 * 30 * 60
    # a warm-up of 3, beside the sidecar started before it, needs 3 + 2 at once: more than the running sum
    pod["spec"]["initContainers"][1]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    assert finished_run(pod, "MODIFIED", {"donor-1-gpu": "donor-1"}, T0).gpus == 5  # type: ignore[union-attr]
    # a sidecar after the plain init container does not run beside it
    pod["spec"]["initContainers"].reverse()
    assert finished_run(pod, "MODIFIED", {"donor-1-gpu": "donor-1"}, T0).gpus == 3  # type: ignore[union-attr]


def test_a_pod_on_a_virtual_node_is_metered_whatever_labels_its_creator_wrote(
        origin: RunningOrigin, api_client: Any, tmp_path: Path) -> None:
    from gpu_offload.liqo_peering.placement import scheduling_fragment

    core = kubernetes.client.CoreV1Api(api_client)
    ns = offloaded_namespace(api_client)
    core.patch_namespace(ns, {"metadata": {"labels": {"gpu-offload.io/user-namespace": "true"},
                                           "annotations": {"gpu-offload.io/user": "ursula"}}})
    state = HubState(HubConfig(), api_client, Store(f"sqlite:///{tmp_path}/usage.sqlite")).start()
    try:
        assert state.wait_synced(60)
        # the user's own pod (from their server's account): none of the project's labels, a GPU on a donor
        fragment = scheduling_fragment("donor-1", 2)
        core.create_namespaced_pod(ns, {
            "metadata": {"name": "my-own"},
            "spec": {"restartPolicy": "Never", "tolerations": fragment["tolerations"], "affinity": fragment["affinity"],
                     "containers": [{"name": "c", "image": "python:3.11", "resources": fragment["resources"],
                                     "command": ["python3", "-c", "import time; time.sleep(1)"]}]}})
        wait_until(lambda: state.store.totals("ursula"), "the unlabelled pod's run to be recorded")
        (run,) = state.store.runs("ursula")
        assert (run.pod, run.gpus, run.cluster_id) == ("my-own", 2, "donor-1") and run.gpu_seconds > 0
    finally:
        state.close()
        core.delete_namespace(ns)


def test_a_donor_that_backdates_its_pods_times_is_billed_what_the_origin_saw(
        origin: RunningOrigin, api_client: Any, tmp_path: Path) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    ns = offloaded_namespace(api_client)
    url = f"sqlite:///{tmp_path}/usage.sqlite"
    body = _runner_pod("gpuo-backdated", "dora", 1)
    body["spec"]["containers"][0]["command"] = ["python3", "-c", "import time; time.sleep(2)"]
    state = HubState(HubConfig(), api_client, Store(url)).start()
    began = datetime.now(timezone.utc)
    try:
        assert state.wait_synced(60)
        core.create_namespaced_pod(ns, body)
        wait_until(lambda: [p for p in state.pods.objects() if p["metadata"]["name"] == "gpuo-backdated"
                            and p["status"].get("phase") == "Running"], "the meter to see the pod Running")
        seen_by = datetime.now(timezone.utc)
    finally:
        state.close()  # the service restarts while the run goes on
    wait_until(lambda: core.read_namespaced_pod("gpuo-backdated", ns).status.phase == "Succeeded", "the run's end")
    # the donor says the pod ran from ten years ago to ten years ahead; Liqo copies its status as it is
    forged = {"name": "runner", "image": "python:3.11", "imageID": "", "ready": False, "restartCount": 0,
              "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2016-11-27T00:00:00Z",
                                       "finishedAt": "2036-11-27T00:00:00Z"}}}
    core.patch_namespaced_pod_status("gpuo-backdated", ns, {"status": {
        "startTime": "2016-11-27T00:00:00Z", "containerStatuses": [forged]}})
    restarted = HubState(HubConfig(), api_client, Store(url)).start()
    try:
        assert restarted.wait_synced(60)
        wait_until(lambda: restarted.store.totals("dora"), "the run to be recorded")
        (run,) = restarted.store.runs("dora")
        assert run.gpu_seconds <= (datetime.now(timezone.utc) - began).total_seconds()
        assert began <= run.started <= seen_by  # when the meter first saw it run, before the restart
    finally:
        restarted.close()
        core.delete_namespace(ns)


def test_part_of_a_gpu_is_charged_as_that_part_in_each_sharing_mode() -> None:
    from gpu_offload.hub_extension.accounting.cost import PricePoint, priced
    from gpu_offload.liqo_peering.sharing import GpuOffer, MigProfile

    gib = 2**30
    offers = {
        "sliced": GpuOffer("time-slicing", 80 * gib, 4, "nvidia.com/gpu.shared"),
        "mig": GpuOffer("mig", 80 * gib, mig_profiles=(MigProfile("1g.10gb", 10 * gib, 1 / 7),)),
        "hami": GpuOffer("memory", 80 * gib),
        "whole": GpuOffer(),
    }
    asks = {"sliced": {"nvidia.com/gpu.shared": "2"}, "mig": {"nvidia.com/mig-1g.10gb": "1"},
            "hami": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(20 * 1024)}, "whole": {"nvidia.com/gpu": "1"}}
    held = {}
    for node, limits in asks.items():
        pod = _pod("Succeeded", node=node)
        pod["spec"]["containers"][0]["resources"]["limits"] = limits
        run = finished_run(pod, "MODIFIED", {n: n for n in asks}, T0 + timedelta(hours=1), running_seen=T0,
                           offers=offers)
        assert run is not None
        held[node] = (run.share, run.gpu_seconds, priced(run, [PricePoint(T0, 2.0)]).cost)
    assert held == {"sliced": (0.5, 1800.0, 1.0), "mig": (0.125, 450.0, 0.25), "hami": (0.25, 900.0, 0.5),
                    "whole": (None, 3600.0, 2.0)}


def test_a_fraction_is_kept_in_the_store(tmp_path: Path) -> None:
    from gpu_offload.liqo_peering.sharing import GpuOffer

    pod = _pod("Succeeded", node="sliced")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu.shared": "1"}
    run = finished_run(pod, "MODIFIED", {"sliced": "donor-3"}, T0 + timedelta(hours=2), running_seen=T0,
                       offers={"sliced": GpuOffer("mps", 2**30 * 24, 2, "nvidia.com/gpu.shared")})
    assert run is not None
    store = Store(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    try:
        assert store.record_run(run)
        again = Store(f"sqlite:///{tmp_path / 'usage.sqlite'}")
        try:
            kept = again.runs(run.user)
        finally:
            again.close()
    finally:
        store.close()
    assert [(r.gpus, r.share, r.gpu_seconds) for r in kept] == [(1, 0.5, 3600.0)]
