"""The kubelet's device manager with NVIDIA's device plugin behind it: which GPU devices a pod gets, refusing a
pod that asks for more than are free, and the environment the plugin's Allocate answer puts in its containers.

A real node's device plugin advertises each ``nvidia.com/`` resource as a list of device IDs; the kubelet
hands a pod as many IDs as it asks for, or refuses it at admission: the pod fails with reason
``UnexpectedAdmissionError`` and ``Allocate failed due to requested number of devices unavailable for
<resource>. Requested: N, Available: M, which is unexpected`` (the scheduler should not have bound it, but a
pod created with ``nodeName`` skips the scheduler). What the plugin then tells the container, as in
NVIDIA's k8s-device-plugin:

- ``NVIDIA_VISIBLE_DEVICES``: the GPUs of the IDs given. Shares of a time-sliced or MPS GPU are IDs
  ``<gpu>::<n>`` of one GPU, so two shares may be of one GPU or of two;
- under MPS, ``CUDA_MPS_PIPE_DIRECTORY`` (the memory and thread limits are the MPS daemon's, set per GPU).
  The plugin always sets ``sharing.mps.failRequestsGreaterThanOne`` under MPS, so a container asking for more
  than one share is refused at admission ("request for '<resource>: N' too large: maximum request size for
  shared resources is 1"); time-slicing refuses so only when the donor's config sets that flag, which this
  emulation does not model (time-sliced donors here grant several shares);
- a MIG profile is its own device (``MIG-<gpu>-<profile>-<n>``);
- a memory isolator (HAMi's ``nvidia.com/gpumem``, in MiB) adds ``CUDA_DEVICE_MEMORY_LIMIT_0``.

How many shares one GPU has comes from the node's ``gpu-offload.io/gpu-replicas`` label (what the donor's
labeller reports); the mode from ``gpu-offload.io/gpu-sharing``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..apiserver.matching import quantity

VENDOR = "nvidia.com/"
MEMORY = "nvidia.com/gpumem"
SHARING_LABEL = "gpu-offload.io/gpu-sharing"
REPLICAS_LABEL = "gpu-offload.io/gpu-replicas"
MPS_PIPE = "/tmp/nvidia-mps"
REASON = "UnexpectedAdmissionError"


def _count(value: Any) -> int:
    try:
        return int(quantity(value))
    except (ValueError, ArithmeticError):
        return 0


def pod_devices(pod: Mapping[str, Any]) -> dict[str, int]:
    """Units of each ``nvidia.com/`` resource the pod's containers ask for (limits; extended resources have no
    overcommit, so a request equals its limit)."""
    asked: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        for key, value in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
            if str(key).startswith(VENDOR):
                asked[key] = asked.get(key, 0) + _count(value)
    return asked


def _too_large(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """The plugin's refusal of a container asking for more than one MPS share, per container as the kubelet
    calls Allocate per container; None when the node is not an MPS donor or every ask is at most one."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(SHARING_LABEL) != "mps" or _count(labels.get(REPLICAS_LABEL, "1")) < 2:
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        for key, value in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
            shared = str(key) == VENDOR + "gpu" or str(key) == VENDOR + "gpu.shared"
            if shared and _count(value) > 1:
                return (f"Allocate failed due to rpc error: code = Unknown desc = request for '{key}: "
                        f"{_count(value)}' too large: maximum request size for shared resources is 1, "
                        "which is unexpected")
    return None


def device_ids(node: Mapping[str, Any], resource: str) -> list[str]:
    """The IDs the node's device plugin advertises for ``resource`` (as many as its allocatable)."""
    meta = node.get("metadata") or {}
    name = meta.get("name", "node")
    count = _count(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))
    if resource == MEMORY:
        return []  # counted in MiB, not devices
    if resource.startswith(VENDOR + "mig-"):
        profile = resource[len(VENDOR + "mig-"):]
        return [f"MIG-{name}-{profile}-{i}" for i in range(count)]
    replicas = max(1, _count((meta.get("labels") or {}).get(REPLICAS_LABEL, "1")))
    shared = resource != VENDOR + "gpu" or replicas > 1
    if shared and replicas > 1:
        return [f"GPU-{name}-{i // replicas}::{i % replicas}" for i in range(count)]
    return [f"GPU-{name}-{i}" for i in range(count)]


@dataclass
class DeviceManager:
    """Devices given to the pods of each node, by pod uid (in memory, like the rest of the sandbox)."""

    held: dict[str, dict[str, dict[str, list[str]]]] = field(default_factory=dict)
    """node -> pod uid -> resource -> device IDs."""
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    """node -> pod uid -> MiB of an isolator's memory."""

    def allocate(self, pod: Mapping[str, Any], node: Mapping[str, Any],
                 holding: Collection[str]) -> tuple[dict[str, str], str | None]:
        """Devices for ``pod`` on ``node``: the environment its containers get, or (``{}``, the admission
        error) when some resource has too few free. ``holding``: the uids of pods that have not ended (the
        devices of the others are free again, as the kubelet reclaims those of terminated pods)."""
        node_name = str((node.get("metadata") or {}).get("name", ""))
        uid = str(pod["metadata"]["uid"])
        asked = pod_devices(pod)
        refused = _too_large(pod, node)
        if refused:
            return {}, refused
        for book in (self.held.get(node_name, {}), self.memory.get(node_name, {})):
            for ended in [u for u in book if u not in holding]:
                del book[ended]
        taken = self.held.setdefault(node_name, {})
        given: dict[str, list[str]] = {}
        for resource, count in sorted(asked.items()):
            if resource == MEMORY or count <= 0:
                continue
            busy = {d for other, held in taken.items() if other != uid for d in held.get(resource, [])}
            free = [d for d in device_ids(node, resource) if d not in busy]
            if len(free) < count:
                return {}, (f"Allocate failed due to requested number of devices unavailable for {resource}. "
                            f"Requested: {count}, Available: {len(free)}, which is unexpected")
            given[resource] = free[:count]
        mib = asked.get(MEMORY, 0)
        if mib:
            used = sum(v for other, v in self.memory.get(node_name, {}).items() if other != uid)
            have = _count(((node.get("status") or {}).get("allocatable") or {}).get(MEMORY, 0))
            if used + mib > have:
                return {}, (f"Allocate failed due to requested number of devices unavailable for {MEMORY}. "
                            f"Requested: {mib}, Available: {max(0, have - used)}, which is unexpected")
            self.memory.setdefault(node_name, {})[uid] = mib
        if not given and not mib:
            return {}, None
        taken[uid] = given
        return self._env(node, given, mib), None

    def _env(self, node: Mapping[str, Any], given: Mapping[str, list[str]], mib: int) -> dict[str, str]:
        gpus: list[str] = []
        for ids in given.values():
            for device in ids:
                plain = device.split("::", 1)[0]  # a share's GPU, as the plugin strips the replica number
                if plain not in gpus:
                    gpus.append(plain)
        env = {"NVIDIA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
        if ((node.get("metadata") or {}).get("labels") or {}).get(SHARING_LABEL) == "mps":
            env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE
        if mib:
            env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{mib}m"
        return env

