"""The kubelet's device manager and NVIDIA's device plugin, as the sandbox emulates them: a pod gets the GPU
devices it asks for and sees them as a real pod would, and one asking for more than are free is refused at
admission, whatever bypassed the scheduler."""

from __future__ import annotations

from typing import Any

from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kubelet.devices import DeviceManager, device_ids
from gpu_offload.sandbox.liqo import seed as liqo
from kubernetes.client import ApiException

from ...origins import TWO_A100

DONORS = (liqo.Donor("sliced", 1, "A100", "1.00", sharing="time-slicing", replicas=2),
          liqo.Donor("mps", 1, "A100", "1.00", sharing="mps", replicas=2),
          liqo.Donor("hami", 1, "A100", "1.00", sharing="memory"))
origin = TWO_A100.with_donors(DONORS).fixture()  # the kubelet tests' origin, these three donors peered
core, namespace, custom, offloaded_namespace = fixtures.core, fixtures.namespace, fixtures.custom, fixtures.offloaded_namespace
SHOW = "import os, time; print(os.environ.get('NVIDIA_VISIBLE_DEVICES'), os.environ.get({extra!r}), flush=True); time.sleep(60)"


def _pod(name: str, node: str, limits: dict[str, str], extra: str = "HOME") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}],
        "containers": [{"name": "main", "image": "python:3.11", "command": ["python3", "-c", SHOW.format(extra=extra)],
                        "resources": {"limits": limits}}]}}


def _said(core: Any, namespace: str, name: str) -> str:
    def text() -> str:
        try:
            return core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode().strip()
        except ApiException:  # 400 while the container is still being created
            return ""
    return wait_until(text, f"{name} to print")


def test_shares_of_one_gpu_are_handed_out_until_none_is_left(core: Any, offloaded_namespace: str) -> None:
    ns = offloaded_namespace
    for name in ("a", "b"):
        core.create_namespaced_pod(ns, _pod(name, "sliced-gpu", {"nvidia.com/gpu.shared": "1"}))
    assert [_said(core, ns, n).split()[0] for n in ("a", "b")] == ["GPU-sliced-gpu-0"] * 2  # one GPU, two shares
    core.create_namespaced_pod(ns, _pod("c", "sliced-gpu", {"nvidia.com/gpu.shared": "1"}))
    refused = wait_until(lambda: (p := core.read_namespaced_pod("c", ns)).status.phase == "Failed" and p, "c refused")
    assert refused.status.reason == "UnexpectedAdmissionError"
    assert refused.status.message == ("Allocate failed due to requested number of devices unavailable for "
                                      "nvidia.com/gpu.shared. Requested: 1, Available: 0, which is unexpected")
    core.delete_namespaced_pod("a", ns, grace_period_seconds=0)
    wait_until(lambda: all(p.metadata.name != "a" for p in core.list_namespaced_pod(ns).items), "a gone")
    core.create_namespaced_pod(ns, _pod("d", "sliced-gpu", {"nvidia.com/gpu.shared": "1"}))
    assert _said(core, ns, "d").split()[0] == "GPU-sliced-gpu-0"  # a's share is free again
    for name in ("b", "c", "d"):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_mps_and_a_memory_isolator_tell_the_container_what_a_real_plugin_does(core: Any, offloaded_namespace: str,
                                                                              ) -> None:
    ns = offloaded_namespace
    core.create_namespaced_pod(ns, _pod("m", "mps-gpu", {"nvidia.com/gpu.shared": "1"}, "CUDA_MPS_PIPE_DIRECTORY"))
    core.create_namespaced_pod(ns, _pod("h", "hami-gpu", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288"},
                                        "CUDA_DEVICE_MEMORY_LIMIT_0"))
    assert _said(core, ns, "m").split() == ["GPU-mps-gpu-0", "/tmp/nvidia-mps"]
    assert _said(core, ns, "h").split() == ["GPU-hami-gpu-0", "12288m"]
    core.create_namespaced_pod(ns, _pod("m2", "mps-gpu", {"nvidia.com/gpu.shared": "2"}))
    refused = wait_until(lambda: (p := core.read_namespaced_pod("m2", ns)).status.phase == "Failed" and p, "m2 refused")
    assert refused.status.reason == "UnexpectedAdmissionError"
    assert "request for 'nvidia.com/gpu.shared: 2' too large: maximum request size for shared resources is 1" in (
        refused.status.message)
    core.create_namespaced_pod(ns, _pod("h2", "hami-gpu", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "81920"}))
    refused = wait_until(lambda: (p := core.read_namespaced_pod("h2", ns)).status.phase == "Failed" and p, "h2 refused")
    assert "unavailable for nvidia.com/gpumem. Requested: 81920, Available: 69632" in refused.status.message
    for name in ("m", "m2", "h", "h2"):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_device_ids_follow_the_nodes_resources_and_replicas() -> None:
    node = {"metadata": {"name": "n", "labels": {"gpu-offload.io/gpu-replicas": "2"}},
            "status": {"allocatable": {"nvidia.com/gpu.shared": "4", "nvidia.com/mig-1g.10gb": "2"}}}
    assert device_ids(node, "nvidia.com/gpu.shared") == ["GPU-n-0::0", "GPU-n-0::1", "GPU-n-1::0", "GPU-n-1::1"]
    assert device_ids(node, "nvidia.com/mig-1g.10gb") == ["MIG-n-1g.10gb-0", "MIG-n-1g.10gb-1"]
    manager = DeviceManager()
    pod = {"metadata": {"uid": "u1"}, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}
    env, refusal = manager.allocate(pod, node, {"u1"})
    assert refusal is None and env == {"NVIDIA_VISIBLE_DEVICES": "MIG-n-1g.10gb-0"}


def test_an_mps_donor_refuses_two_shares_in_one_container_while_time_slicing_grants_them() -> None:
    """NVIDIA's plugin forces failRequestsGreaterThanOne under MPS: two shares are refused even with four free."""
    def node(mode: str) -> dict[str, Any]:
        return {"metadata": {"name": "n", "labels": {"gpu-offload.io/gpu-replicas": "4", "gpu-offload.io/gpu-sharing": mode}},
                "status": {"allocatable": {"nvidia.com/gpu.shared": "4"}}}
    pod = {"metadata": {"uid": "u1"}, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]}}
    env, refusal = DeviceManager().allocate(pod, node("mps"), {"u1"})
    assert env == {} and refusal is not None
    assert "request for 'nvidia.com/gpu.shared: 2' too large: maximum request size for shared resources is 1" in refusal
    env, refusal = DeviceManager().allocate(pod, node("time-slicing"), {"u1"})
    assert refusal is None and env == {"NVIDIA_VISIBLE_DEVICES": "GPU-n-0"}
    one = {"metadata": {"uid": "u2"}, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}}
    env, refusal = DeviceManager().allocate(one, node("mps"), {"u2"})
    assert refusal is None and env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
