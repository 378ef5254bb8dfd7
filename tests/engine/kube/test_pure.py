"""The backend's pure parts: pod states read into sentences, the cell pod as built (schema-valid), outputs
read back from object storage, and the settings read from the environment."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.placement import scheduling_fragment
from gpu_offload.liqo_peering.specs import BUNDLE_URL_ENV, RunnerPodSpec, runner_pod
from gpu_offload.liqo_peering.wording import duration

from gpu_offload.engine.backends.kube.config import DEFAULT_IMAGE, configured, from_environment
from gpu_offload.engine.backends.kube.explain import (
    COMMAND,
    FAILED,
    FINISHED,
    RUNNING,
    WAITING,
    PodContext,
    front_words,
    pod_state,
    stopped_by_kueue,
)
from gpu_offload.engine.backends.kube.podspec import fetched_outputs, same_object
from gpu_offload.engine.backends.kube.requeue import after_preemption
from gpu_offload.engine.backends.kube.user_runs import run_from_pod
from gpu_offload.engine.errors import BackendNotConfigured

CTX = PodContext("donor-b", 2, "pytorch/pytorch:2.3", "16Gi")


def pod(phase: str = "Pending", reason: str = "", message: str = "", state: dict[str, Any] | None = None,
        conditions: list[dict[str, Any]] | None = None, node: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status.update(reason=reason, message=message)
    if state is not None:
        status["containerStatuses"] = [{"name": "runner", "state": state}]
    if conditions:
        status["conditions"] = conditions
    return {"metadata": {"name": "gpuo-1", "namespace": "alice"}, "spec": {"nodeName": node}, "status": status}


def test_out_of_memory_names_cluster_gpus_limit_and_the_setting() -> None:
    state = pod_state(pod("Failed", state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), CTX)
    assert (state.kind, state.reason, state.exit_code) == (FAILED, "OOMKilled", 137)
    assert "out of memory on donor-b with 2 GPUs (memory limit 16Gi)" in state.text
    assert "GPU_OFFLOAD_MEMORY" in state.text


def test_pending_states_read_as_progress_or_as_failures() -> None:
    creating = pod(state={"waiting": {"reason": "ContainerCreating"}}, node="donor-b-gpu")
    assert pod_state(creating, CTX).kind == WAITING
    assert pod_state(creating, CTX).text == "pod Pending on donor-b-gpu (donor-b): ContainerCreating"
    first_pull = pod(state={"waiting": {"reason": "ErrImagePull", "message": "not found"}})
    assert pod_state(first_pull, CTX).kind == WAITING  # the kubelet retries once before it gives up
    backoff = pod_state(pod(state={"waiting": {"reason": "ImagePullBackOff", "message": "x"}}), CTX)
    assert backoff.kind == FAILED and "pytorch/pytorch:2.3" in backoff.text and "--image" in backoff.text
    offloading = pod_state(pod(reason="OffloadingBackOff", message="not offloaded"), CTX)
    assert offloading.kind == FAILED and "namespace alice is not offloaded" in offloading.text
    unschedulable = pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    read = pod_state(unschedulable, CTX)
    assert read.kind == FAILED and "3 Insufficient nvidia.com/gpu" in read.text
    # the same pod admitted by Kueue waits: Kueue's waitForPodsReady decides, and the run queues again once
    admitted = {**unschedulable, "metadata": {**unschedulable["metadata"],
                                              "labels": {"kueue.x-k8s.io/queue-name": "gpu-offload"}}}
    read = pod_state(admitted, CTX)
    assert (read.kind, read.reason) == (WAITING, "Unschedulable")
    assert read.text.startswith("admitted by Kueue to donor-b, but no node can take the pod yet (the scheduler says "
                                '"0/3 nodes are available: 3 Insufficient nvidia.com/gpu."); if it does not start '
                                "within Kueue's waitForPodsReady timeout"), read.text


def test_what_a_reflected_pod_status_or_a_stop_event_says_is_shown_on_one_printable_line() -> None:
    # Liqo reflects the donor's pod status onto the origin's pod; anyone who may write events writes a stop's words
    forged = "\x1b[2J\r\nfinished: exit code 0\n" + "z" * 2000
    states = [pod_state(pod("Failed", reason="Evicted", message=forged), CTX),
              pod_state(pod("Failed", reason="Whatever", message=forged), CTX),
              pod_state(pod(state={"waiting": {"reason": "ImagePullBackOff", "message": forged}}), CTX),
              pod_state(pod(reason="OffloadingBackOff", message=forged), CTX),
              stopped_by_kueue("WorkloadEvictedDueTo\x07Deactivated", forged, None, CTX)]
    for state in states:
        assert state.kind == FAILED and "[2J finished: exit code 0 zzz" in state.text, state.text
        assert all(c.isprintable() for c in state.text) and "z" * 1001 not in state.text
    assert states[-1].summary.startswith("stopped by Kueue before it started (Deactivated: [2J finished")


def test_node_lost_deadline_and_normal_ends() -> None:
    lost = pod_state(pod("Failed", reason="NodeLost", message="Node donor-b-gpu is unresponsive"), CTX)
    assert lost.lost and lost.kind == FAILED and "donor-b" in lost.text
    deadline = pod_state(pod("Failed", reason="DeadlineExceeded"), CTX)
    assert deadline.kind == FAILED and "--timeout" in deadline.text
    done = pod_state(pod("Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}}), CTX)
    assert (done.kind, done.exit_code) == (FINISHED, 0)
    assert pod_state(pod("Running", state={"running": {}}), CTX).kind == RUNNING


def test_a_pod_evicted_through_the_eviction_api_reads_as_evicted_from_its_node() -> None:
    # the condition kube-apiserver writes before it deletes an evicted pod with its grace period (test_eviction_api)
    target = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
              "message": "Eviction API: evicting"}
    evicted = pod_state(pod("Running", state={"running": {}}, conditions=[target], node="donor-b-gpu"), CTX)
    assert (evicted.kind, evicted.reason) == (FAILED, "EvictionByEvictionAPI")
    assert evicted.summary == "evicted from donor-b (node donor-b-gpu) through the Eviction API, as a drain of the node does"
    assert evicted.text.startswith(evicted.summary + "; output so far is kept") and "Run the cell again" in evicted.text
    assert not evicted.lost and not evicted.elsewhere  # a cell that ran is not rerun unasked
    # the condition False (written and withdrawn) is no eviction
    assert pod_state(pod("Running", state={"running": {}}, conditions=[{**target, "status": "False"}]), CTX).kind == RUNNING


KUEUE_MESSAGE = ("Preempted to accommodate a workload (UID: 5c1a, JobUID: 9f2e) due to prioritization in the "
                 "ClusterQueue; preemptor path: /gpu-offload; preemptee path: /gpu-offload")


def test_a_pod_kueue_preempted_reads_as_preempted_with_how_long_it_ran() -> None:
    # Kueue's pod condition (pod_controller's Stop), written before it deletes the pod; the runner may have
    # exited 0 on SIGTERM, which must not read as a finished cell
    target = {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvictedDueToPreempted",
              "message": KUEUE_MESSAGE, "lastTransitionTime": "2026-11-23T10:14:30Z"}
    ran = pod("Running", state={"terminated": {"exitCode": 0, "startedAt": "2026-11-23T10:00:00Z"}},
              conditions=[target])
    state = pod_state(ran, CTX)
    assert (state.kind, state.reason) == (FAILED, "Preempted")
    assert state.text.startswith("preempted after 14 min by a higher-priority run: Kueue gave its 2 GPUs on donor-b")
    assert "output so far is kept, no variable was copied back" in state.text
    assert state.summary == "preempted after 14 min by a higher-priority run"
    gated = pod_state(pod(conditions=[target]), CTX)
    assert gated.summary == "preempted before it started by a higher-priority run"


def test_kueues_other_stops_and_reasons_are_said_in_its_words() -> None:
    reclaimed = stopped_by_kueue("", KUEUE_MESSAGE.replace("prioritization in the ClusterQueue",
                                                           "reclamation within the cohort"), 75, CTX)
    assert reclaimed.summary == "preempted after 1 min by Kueue (reclamation within the cohort)"
    timeout = stopped_by_kueue("WorkloadEvictedDueToPodsReadyTimeout", "Exceeded the PodsReady timeout alice/pod-x",
                               None, CTX)
    assert (timeout.kind, timeout.reason) == (FAILED, "PodsReadyTimeout")
    assert "stopped by Kueue before it started (PodsReadyTimeout: Exceeded the PodsReady timeout" in timeout.text
    # Kueue deletes a plain pod it evicts for this instead of requeueing it: the run's one retry queues a new pod
    assert timeout.elsewhere == "Kueue evicted the pod (PodsReadyTimeout: Exceeded the PodsReady timeout alice/pod-x)"
    # after the runner started, or for another reason, nothing is retried
    assert not stopped_by_kueue("WorkloadEvictedDueToPodsReadyTimeout", "Exceeded", 30, CTX).elsewhere
    assert not stopped_by_kueue("WorkloadEvictedDueToDeactivated", "Deactivated", None, CTX).elsewhere
    assert [duration(s, "min") for s in (0.4, 59, 61, 3600 + 5 * 60)] == ["0 s", "59 s", "1 min", "1 h 5 min"]


def test_a_preempted_command_is_told_in_a_commands_words_and_a_cell_in_a_cells() -> None:
    """`gpu-offload run` and the magic share the kube backend's sentences; only the front end's words differ."""
    command = dataclasses.replace(CTX, words=front_words(cli=True))
    for ctx, again, kept in [(CTX, "Run the cell again", "output so far is kept, no variable was copied back"),
                             (command, "Run the command again", "its output so far is shown above")]:
        preempted = stopped_by_kueue("", KUEUE_MESSAGE, 30, ctx)
        assert f"{kept}. {again} to queue it once more, or with --priority of a higher class" in preempted.text
        evicted = stopped_by_kueue("WorkloadEvictedDueToDeactivated", "Deactivated", 30, ctx)
        assert evicted.text.endswith(f"{kept}. {again} to queue it once more")
    assert "cell" not in stopped_by_kueue("", KUEUE_MESSAGE, 30, command).text
    shown = after_preemption(stopped_by_kueue("", KUEUE_MESSAGE, 30, command), 3, False, False, False, COMMAND)
    assert shown is not None and not shown.rerun and "to have such a run requeued and rerun once" in shown.words
    silent = after_preemption(stopped_by_kueue("", KUEUE_MESSAGE, 30, command), 0, False, False, False, COMMAND)
    assert silent is not None and silent.rerun and "nothing of the first attempt reached the terminal" in silent.words
    cell = after_preemption(stopped_by_kueue("", KUEUE_MESSAGE, 30, CTX), 3, False, False, False)
    assert cell is not None and "to have such a cell requeued" in cell.words


def _spec(**changes: Any) -> RunnerPodSpec:
    base: dict[str, Any] = dict(run_id="0123abcd", namespace="alice", image="python:3.11-slim", user="alice@example.org",
                                kernel="k1", scheduling=scheduling_fragment("donor-b", 1), timeout=90)
    return RunnerPodSpec(**{**base, **changes})


def test_the_cell_pod_is_schema_valid_with_a_memory_limit_and_the_bootstrap() -> None:
    built = runner_pod(_spec(memory="8Gi", bundle_url="http://127.0.0.1:9/b?X-Amz-Signature=s", bundle_sha256="ab" * 32))
    assert kubernetes_validate.validate(built, "1.36", strict=True) == "1.36"
    container = built["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "8Gi"}
    assert container["command"][:3] == ["python3", "-I", "-c"] and container["command"][-2].endswith("runner.pyz")
    assert container["command"][-1] == "ab" * 32  # the digest the bootstrap checks the bundle against
    assert {"name": BUNDLE_URL_ENV, "value": "http://127.0.0.1:9/b?X-Amz-Signature=s"} in container["env"]
    plain = runner_pod(_spec())
    assert kubernetes_validate.validate(plain, "1.36", strict=True) == "1.36"
    assert "--bundle" in plain["spec"]["containers"][0]["command"]


def _own(index: int, url: str) -> bool:
    return same_object(url, f"http://s/b/out-{index}?X-Amz-Signature=other")


def test_outputs_go_to_object_storage_and_come_back_inline() -> None:
    stored = {0: b"buffer", 1: b"main"}
    packed, refs = fetched_outputs({"kind": "url", "url": "http://s/b/out-1?X-Amz-Signature=a", "size": 4, "index": 1},
                                   [{"kind": "url", "url": "http://s/b/out-0", "size": 6, "index": 0}],
                                   lambda ref: stored[ref["index"]], _own)
    assert packed == {"kind": "inline", "data": b"main", "size": 4}
    assert refs == [{"kind": "inline", "data": b"buffer", "size": 6}]


def test_a_pod_cannot_point_the_kernel_at_a_file_or_another_url() -> None:
    read: list[int] = []

    def reader(ref: Mapping[str, Any]) -> bytes:
        read.append(ref["index"])
        return b"x"

    packed, refs = fetched_outputs(
        {"kind": "shm", "path": "/home/alice/notes.txt", "size": 4},
        [{"kind": "url", "url": "http://evil.example/out-0", "size": 6, "index": 0},
         {"kind": "url", "url": "http://s/b/out-1", "size": 6, "index": "1"},
         {"kind": "url", "url": "http://s/b/out-3", "size": 6, "index": 3}],
        reader, _own)
    assert packed["kind"] == "refused" and "file on the notebook's machine" in packed["reason"]
    assert [r["kind"] for r in refs] == ["refused", "refused", "inline"]
    assert "not one of its run's uploads" in refs[0]["reason"] and "not one of its run's uploads" in refs[1]["reason"]
    assert read == [3]  # only the run's own object was asked for


def test_settings_from_the_environment() -> None:
    assert configured({"GPU_OFFLOAD_NAMESPACE": "alice"})
    assert not configured({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_BACKEND": "local"})
    assert not configured({})
    hub = from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_SERVICE_URL": "http://hub/",
                            "GPU_OFFLOAD_S3_BUCKET": "b", "JUPYTERHUB_USER": "alice", "GPU_OFFLOAD_KERNEL_ID": "k"})
    assert (hub.create_offloading, hub.image, hub.user, hub.kernel) == (False, DEFAULT_IMAGE, "alice", "k")
    assert not hub.metered  # only where the spawner says a meter runs
    assert from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_METERED": "1"}).metered
    assert hub.storage is not None and hub.storage.bucket == "b"
    with pytest.raises(BackendNotConfigured, match="GPU_OFFLOAD_NAMESPACE"):
        from_environment({})


def test_queueing_settings_name_the_queue_and_the_default_priority() -> None:
    # unset, the queue is found at the first launch (test_queueing: the one LocalQueue of the namespace)
    plain = from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_PRIORITY": "batch"})
    assert plain.queue is None
    queued = from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_QUEUE": "gpu-offload",
                               "GPU_OFFLOAD_PRIORITY": "interactive"})
    assert (queued.queue, queued.priority) == ("gpu-offload", "interactive")


def test_the_placement_policy_is_chosen_by_name_and_a_wrong_name_lists_the_valid_ones() -> None:
    assert from_environment({"GPU_OFFLOAD_NAMESPACE": "alice"}).policy == "most-free"
    chosen = from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_PLACEMENT_POLICY": "bin-pack"})
    assert chosen.policy == "bin-pack"
    with pytest.raises(BackendNotConfigured) as err:
        from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_PLACEMENT_POLICY": "fastest"})
    assert "GPU_OFFLOAD_PLACEMENT_POLICY='fastest'" in str(err.value)
    assert "most-free, bin-pack, first-fit" in str(err.value)


def _kubeconfig(path: Path, namespace: str | None) -> str:
    context: dict[str, str] = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "elsewhere", "context": {"cluster": "c", "user": "u", "namespace": "not-this"}},
                     {"name": "here", "context": context}]}))
    return str(path)


def test_the_namespace_falls_back_to_the_kubeconfig_context_as_kubectl_does(tmp_path: Path) -> None:
    team = _kubeconfig(tmp_path / "team", "team-a")
    assert from_environment({"KUBECONFIG": team}).namespace == "team-a"
    assert from_environment({"KUBECONFIG": team, "GPU_OFFLOAD_NAMESPACE": "mine"}).namespace == "mine"
    # a context that names none means `default` to kubectl; KUBECONFIG may list several files
    bare = _kubeconfig(tmp_path / "bare", None)
    assert from_environment({"KUBECONFIG": f"{tmp_path / 'missing'}:{bare}"}).namespace == "default"
    with pytest.raises(BackendNotConfigured, match="GPU_OFFLOAD_NAMESPACE is not set and there is no kubeconfig"):
        from_environment({"KUBECONFIG": str(tmp_path / "missing")})


def test_a_pending_runs_reason_in_the_panel_is_one_printable_line() -> None:
    waiting = pod(state={"waiting": {"reason": "ErrImagePull\x1b[2J\nforged"}})
    waiting["metadata"]["labels"] = {L.RUN_ID: "r1"}
    run = run_from_pod(waiting)
    assert run is not None and run.detail == "pod gpuo-1: ErrImagePull [2J forged"
