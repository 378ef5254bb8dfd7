"""The backend's pure parts: pod states read into sentences, the cell pod as built (schema-valid), the bundle
rewritten for object storage, and the settings read from the environment."""

from __future__ import annotations

import pickle
from typing import Any

import kubernetes_validate
import pytest
from gpu_offload.liqo_peering.placement import scheduling_fragment
from gpu_offload.liqo_peering.specs import RunnerPodSpec
from gpu_offload.magics.backends.kube.config import DEFAULT_IMAGE, configured, from_environment
from gpu_offload.magics.backends.kube.explain import FAILED, FINISHED, RUNNING, WAITING, PodContext, pod_state
from gpu_offload.magics.backends.kube.podspec import (
    BUNDLE_URL_ENV,
    cell_pod,
    fetched_outputs,
    with_output_urls,
)
from gpu_offload.magics.errors import BackendNotConfigured
from gpu_offload.magics.runner.bundle import encode_bundle, make_bundle

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


def test_node_lost_deadline_and_normal_ends() -> None:
    lost = pod_state(pod("Failed", reason="NodeLost", message="Node donor-b-gpu is unresponsive"), CTX)
    assert lost.lost and lost.kind == FAILED and "donor-b" in lost.text
    deadline = pod_state(pod("Failed", reason="DeadlineExceeded"), CTX)
    assert deadline.kind == FAILED and "--timeout" in deadline.text
    done = pod_state(pod("Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}}), CTX)
    assert (done.kind, done.exit_code) == (FINISHED, 0)
    assert pod_state(pod("Running", state={"running": {}}), CTX).kind == RUNNING


def _spec(**changes: Any) -> RunnerPodSpec:
    base: dict[str, Any] = dict(run_id="0123abcd", namespace="alice", image=DEFAULT_IMAGE, user="alice@example.org",
                                kernel="k1", scheduling=scheduling_fragment("donor-b", 1), timeout=90)
    return RunnerPodSpec(**{**base, **changes})


def test_the_cell_pod_is_schema_valid_with_a_memory_limit_and_the_bootstrap() -> None:
    built = cell_pod(_spec(), memory="8Gi", bundle_url="http://127.0.0.1:9/b?X-Amz-Signature=s")
    assert kubernetes_validate.validate(built, "1.36", strict=True) == "1.36"
    container = built["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "8Gi"}
    assert container["command"][:3] == ["python3", "-I", "-c"] and container["command"][-1].endswith("runner.pyz")
    assert {"name": BUNDLE_URL_ENV, "value": "http://127.0.0.1:9/b?X-Amz-Signature=s"} in container["env"]
    plain = cell_pod(_spec())
    assert kubernetes_validate.validate(plain, "1.36", strict=True) == "1.36"
    assert "--bundle" in plain["spec"]["containers"][0]["command"]


def test_outputs_go_to_object_storage_and_come_back_inline() -> None:
    bundle = encode_bundle(make_bundle("y = 1", outputs=["y"], output_transport="inline", input_transport="inline"))
    rewritten = pickle.loads(with_output_urls(bundle, ["http://s/out-0", "http://s/out-1"]))
    assert rewritten["output_transport"] == "url" and rewritten["output_urls"] == ["http://s/out-0", "http://s/out-1"]
    stored = {0: b"buffer", 1: b"main"}
    packed, refs = fetched_outputs({"kind": "url", "url": "http://s/out-1", "size": 4, "index": 1},
                                   [{"kind": "url", "url": "http://s/out-0", "size": 6, "index": 0}], stored.__getitem__)
    assert packed == {"kind": "inline", "data": b"main", "size": 4}
    assert refs == [{"kind": "inline", "data": b"buffer", "size": 6}]


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


def test_the_placement_policy_is_chosen_by_name_and_a_wrong_name_lists_the_valid_ones() -> None:
    assert from_environment({"GPU_OFFLOAD_NAMESPACE": "alice"}).policy == "most-free"
    chosen = from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_PLACEMENT_POLICY": "bin-pack"})
    assert chosen.policy == "bin-pack"
    with pytest.raises(BackendNotConfigured) as err:
        from_environment({"GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_PLACEMENT_POLICY": "fastest"})
    assert "GPU_OFFLOAD_PLACEMENT_POLICY='fastest'" in str(err.value)
    assert "most-free, bin-pack, first-fit" in str(err.value)
