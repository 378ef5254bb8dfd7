"""A distributed cell (``--nodes``) that waits in Kueue's queue, on the sandbox's Kueue and on real Kueue 0.19
(tests/realcluster): its Indexed Job is one Workload for all its pods, waits while another run holds the GPUs,
says its place in line, is admitted whole to one donor's flavor, and every rank runs; afterwards no Job, pod,
Service, Secret or Workload is left. A plain cell (no torch): the ranks' rendezvous address is not used, so the
real cluster's missing cluster DNS does not matter."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import StorageSettings
from gpu_offload.engine.errors import RemoteError

from ...origins import ONE_A100_PAIR_QUEUED
from ...sandbox.kueue_setup import workloads
from .conftest import BUCKET, STOCK_IMAGE, kueue_origin_on_each_cluster, queued_user_namespace, settings
from .helpers import Sink, run_cell
from .test_distributed import everything_left
from .test_queueing import QUEUE, fill, in_thread

(DONOR,) = ONE_A100_PAIR_QUEUED.donors
"""One donor with two GPUs: the run's two pods (one GPU each) fit only once the holder is gone."""
ONE_EACH = Ranks(nodes=2, procs_per_node=1)
CELL = "import os\nrank = int(os.environ['RANK'])\nprint(f'rank {rank} of {os.environ[\"WORLD_SIZE\"]}', flush=True)\n"


origin = kueue_origin_on_each_cluster(ONE_A100_PAIR_QUEUED)  # shared with test_preemption.py


@pytest.fixture()
def pool(origin: Any, core: Any, custom: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user namespace as the hub makes one with queueing on; afterwards nothing is left in it."""
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    namespace = queued_user_namespace(core, custom)
    yield namespace
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "no pod left", timeout=120)
    wait_until(lambda: not workloads(custom, namespace), "no Workload left", timeout=120)
    core.delete_namespace(namespace)


def test_a_distributed_cell_waits_in_line_as_one_workload_and_all_its_ranks_run_once_admitted(
        api_client: Any, core: Any, custom: Any, pool: str) -> None:
    holder = "holder"
    assert fill(core, pool, holder) == DONOR.cluster_id  # one of the two GPUs: the run's two pods do not fit
    backend = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    results: dict[str, Any] = {}
    sink = Sink()
    try:
        thread = in_thread(backend, CELL, sink, results, "ranks", ranks=ONE_EACH, timeout=600)
        wait_until(lambda: "ranks" in results or [n for n in sink.notices if " in line; waiting " in n],
                   "the distributed cell showing its place in line", timeout=120)
        assert "ranks" not in results, results
        place = [n for n in sink.notices if " in line; waiting " in n]
        # the line's length shows once the ClusterQueue's status was read, which may come after the first notice
        assert re.match(r"queued for 2 pods of 1 GPU: 1st (of 1 )?in line; waiting ", place[0]), place
        # one Workload for the Job's two pods, waiting for quota; no pod runs yet
        [waiting] = [w for w in workloads(custom, pool) if w["metadata"]["name"].startswith("job-")]
        assert [(p["count"], p["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                for p in waiting["spec"]["podSets"]] == [(2, "1")]
        assert not any(c["type"] == "Admitted" and c["status"] == "True"
                       for c in (waiting.get("status") or {}).get("conditions") or [])
        jobs = kubernetes.client.BatchV1Api(api_client).list_namespaced_job(pool).items
        assert [j.spec.suspend for j in jobs] == [True]  # Kueue holds the Job suspended
        core.delete_namespaced_pod(holder, pool, grace_period_seconds=0)
        thread.join(300)
        assert not thread.is_alive(), sink.notices
    finally:
        backend.close()
    outcome, sink, run = results["ranks"]
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert sorted(sink.text.splitlines()) == ["[rank 0] rank 0 of 2", "[rank 1] rank 1 of 2"]
    assert any(n.startswith("admitted by Kueue after ") for n in sink.notices), sink.notices
    wait_until(lambda: not everything_left(api_client, pool), "Job, pods, Service and Secret deleted", timeout=120)
    wait_until(lambda: not workloads(custom, pool), "the Job's Workload gone", timeout=120)


HOLD = ("import os, time\nrank = int(os.environ['RANK'])\nprint(f'rank {rank} started', flush=True)\n"
        "try:\n    while True:\n        time.sleep(0.1)\nfinally:\n    print(f'rank {rank} stopping', flush=True)\n")
"""A distributed cell that runs until it is stopped (a SIGTERM interrupts each rank: its ``finally`` prints)."""


def test_a_distributed_run_preempted_by_kueue_ends_saying_so_and_leaves_nothing(
        api_client: Any, core: Any, custom: Any, pool: str) -> None:
    """A ``batch`` distributed run holds both GPUs; an ``interactive`` cell of one GPU makes Kueue preempt the
    Job's Workload (Kueue suspends the Job, the Job controller deletes its pods). The run ends saying Kueue
    preempted it, that it is not rerun (a distributed run is never rerun by the project), and its Job is deleted
    with everything it owns, so Kueue does not run it again behind the user's back once the GPUs free."""
    batch = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    other = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    results: dict[str, Any] = {}
    sink = Sink()
    try:
        thread = in_thread(batch, HOLD, sink, results, "ranks", ranks=ONE_EACH, priority="batch", timeout=600)
        wait_until(lambda: "ranks" in results or sink.text.count(" started") == 2, "both ranks running",
                   timeout=180)
        assert "ranks" not in results, results
        outcome, interactive, _ = run_cell(other, "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", (outcome.error, interactive.notices)
        assert "interactive ran" in interactive.text
        thread.join(180)
        assert not thread.is_alive(), sink.notices
    finally:
        batch.close()
        other.close()
    outcome, sink, _ = results["ranks"]
    error = outcome.error
    assert isinstance(error, RemoteError) and error.ename == "Preempted", (error, sink.notices)
    words = error.evalue
    assert "preempted after " in words and "by a higher-priority run" in words, words
    assert "Kueue gave its 2 GPUs on " in words and "A distributed run is not rerun" in words, words
    wait_until(lambda: not everything_left(api_client, pool), "Job, pods, Service and Secret deleted", timeout=120)
    wait_until(lambda: not workloads(custom, pool), "the Job's Workload gone", timeout=120)


def _jobs(api_client: Any, pool: str) -> list[Any]:
    return list(kubernetes.client.BatchV1Api(api_client).list_namespaced_job(pool).items)


def test_a_distributed_session_preempted_while_idle_is_said_and_its_job_is_not_run_again_unattended(
        api_client: Any, core: Any, custom: Any, pool: str) -> None:
    """A ``batch`` distributed session (2 pods of 1 GPU, both GPUs) is idle between cells; an ``interactive`` cell
    makes Kueue preempt its Job (suspended, pods deleted). The user is told (the status line, then the next
    cell's note), the old Job is deleted instead of being admitted again by Kueue once the GPUs free (its
    launchers would hold both GPUs with nobody attached), and the next cell starts the session anew; closing
    leaves no Job, pod, Service, Secret or Workload."""
    batch = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    other = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    try:
        outcome, first, _ = run_cell(batch, "import os\nx = 41 + int(os.environ['RANK'])\n", {}, session="ddp",
                                     ranks=ONE_EACH, priority="batch")
        assert outcome.status == "ok", (outcome.error, first.notices)
        (old,) = _jobs(api_client, pool)
        outcome, interactive, _ = run_cell(other, "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", (outcome.error, interactive.notices)
        # the old Job goes: Kueue would otherwise start its pods again once the interactive cell gave its GPU back
        wait_until(lambda: old.metadata.name not in {j.metadata.name for j in _jobs(api_client, pool)},
                   "the preempted session's Job deleted", timeout=120)
        said = batch.describe()
        assert re.search(rf"session ddp: its Job {old.metadata.name} was preempted after \S+( \S+)* by a "
                         r"higher-priority run while idle", said), said
        outcome, again, _ = run_cell(batch, CELL, {}, session="ddp", ranks=ONE_EACH, priority="batch")
        assert outcome.status == "ok", (outcome.error, again.notices)
        assert sorted(again.text.splitlines()) == ["[rank 0] rank 0 of 2", "[rank 1] rank 1 of 2"]
        note = [n for n in again.notices if "session ddp: its Job" in n]  # a warning, through the ranks
        assert note and f"its Job {old.metadata.name} was preempted after " in note[0], again.notices
        assert "this cell starts the session anew and the variables of the old one are gone" in note[0], note
    finally:
        batch.close()
        other.close()
    wait_until(lambda: not everything_left(api_client, pool), "Job, pods, Service and Secret deleted", timeout=120)
    wait_until(lambda: not workloads(custom, pool), "the Jobs' Workloads gone", timeout=120)


def test_a_distributed_session_preempted_during_a_cell_ends_it_saying_so_and_its_job_goes(
        api_client: Any, core: Any, custom: Any, pool: str) -> None:
    """A ``batch`` distributed session's cell runs on both GPUs when an ``interactive`` cell makes Kueue preempt the
    session's Job: the cell ends with ``Preempted`` in words (not the ranks' bare ``KeyboardInterrupt``), says the
    session's state is gone, the Job is deleted (Kueue would start its launchers again unattended), the next cell
    starts the session anew saying why, and closing leaves nothing."""
    batch = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    other = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    results: dict[str, Any] = {}
    sink = Sink()
    try:
        thread = in_thread(batch, HOLD, sink, results, "ranks", session="ddp", ranks=ONE_EACH, priority="batch")
        wait_until(lambda: "ranks" in results or sink.text.count(" started") == 2, "both ranks running",
                   timeout=180)
        assert "ranks" not in results, results
        (old,) = _jobs(api_client, pool)
        outcome, interactive, _ = run_cell(other, "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", (outcome.error, interactive.notices)
        thread.join(180)
        assert not thread.is_alive(), sink.notices
        outcome, sink, _ = results["ranks"]
        error = outcome.error
        assert isinstance(error, RemoteError) and error.ename == "Preempted", (error, sink.notices)
        assert "preempted after " in error.evalue and "by a higher-priority run" in error.evalue, error.evalue
        assert "The session's state is gone with it: its Job was deleted" in error.evalue, error.evalue
        wait_until(lambda: old.metadata.name not in {j.metadata.name for j in _jobs(api_client, pool)},
                   "the preempted session's Job deleted", timeout=120)
        outcome, again, _ = run_cell(batch, CELL, {}, session="ddp", ranks=ONE_EACH, priority="batch")
        assert outcome.status == "ok", (outcome.error, again.notices)
        note = [n for n in again.notices if "session ddp: its Job" in n]
        assert note and f"its Job {old.metadata.name} was preempted after " in note[0], again.notices
    finally:
        batch.close()
        other.close()
    wait_until(lambda: not everything_left(api_client, pool), "Job, pods, Service and Secret deleted", timeout=120)
    wait_until(lambda: not workloads(custom, pool), "the Jobs' Workloads gone", timeout=120)


def test_a_distributed_session_with_storage_preempted_during_a_cell_resumes_each_ranks_state(
        api_client: Any, core: Any, custom: Any, pool: str, s3: Any, s3_endpoint: str) -> None:
    """With object storage, a ``batch`` distributed session Kueue preempts during a cell is not lost: the cell ends
    ``Preempted`` saying the next cell resumes it from its checkpoint, and the next cell (a new Job, admitted once
    the GPUs free) has each rank's own state back, the preempted cell's change included (each rank wrote its state
    at the SIGTERM of Kueue's preemption). A queued pod's cluster is not known when it is made, so the session is
    checkpointed as on an untrusted donor: each rank's state comes back as data only (through the kernel's safe
    decoder, rank by rank), its modules named to import again. Nothing is left, stored objects included."""
    batch = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE, trusted=(DONOR,),
                                       storage=StorageSettings(BUCKET, s3_endpoint)), api_client)
    other = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", image=STOCK_IMAGE), api_client)
    results: dict[str, Any] = {}
    sink = Sink()
    try:
        outcome, first, _ = run_cell(batch, "import os\nmine = 41 + int(os.environ['RANK'])\n", {}, session="ddp",
                                     ranks=ONE_EACH, priority="batch")
        assert outcome.status == "ok", (outcome.error, first.notices)
        batch.keeper.settle("ddp")
        thread = in_thread(batch, "mine += 100\n" + HOLD, sink, results, "ranks", session="ddp", ranks=ONE_EACH,
                           priority="batch")
        wait_until(lambda: "ranks" in results or sink.text.count(" started") == 2, "both ranks running",
                   timeout=180)
        (old,) = _jobs(api_client, pool)
        outcome, interactive, _ = run_cell(other, "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", (outcome.error, interactive.notices)
        thread.join(180)
        assert not thread.is_alive(), sink.notices
        error = results["ranks"][0].error
        assert isinstance(error, RemoteError) and error.ename == "Preempted", (error, sink.notices)
        assert "session ddp's next cell resumes it from checkpoint ddp" in error.evalue, error.evalue
        wait_until(lambda: old.metadata.name not in {j.metadata.name for j in _jobs(api_client, pool)},
                   "the preempted session's Job deleted", timeout=120)
        outcome, again, _ = run_cell(batch, "import os\nprint(f\"rank {os.environ['RANK']}: {mine}\", flush=True)\n", {},
                                     session="ddp", ranks=ONE_EACH, priority="batch")
        assert outcome.status == "ok", (outcome.error, again.notices)
        assert sorted(again.text.splitlines()) == ["[rank 0] rank 0: 141", "[rank 1] rank 1: 142"], again.notices
        [note] = [n for n in again.notices if "resumed on" in n]
        assert f"its Job {old.metadata.name} was preempted after " in note, note
        assert "its runner wrote a checkpoint as the pod was stopped (SIGTERM)" in note, note
        assert "os (ranks 0, 1: module os: import it again (an untrusted checkpoint imports nothing))" in note, note
        saved = batch.keeper.store().latest("ddp")
        assert saved is not None and not saved.trusted and saved.manifest["format"] == "safe"
    finally:
        batch.close()
        other.close()
    wait_until(lambda: not everything_left(api_client, pool), "Job, pods, Service and Secret deleted", timeout=120)
    wait_until(lambda: not workloads(custom, pool), "the Jobs' Workloads gone", timeout=120)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])] == []
