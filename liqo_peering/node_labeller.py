"""The donor's node labeller: asks NVML (pynvml) about the node's GPUs and the NVIDIA runtime's config.toml about
unprivileged pods, and keeps the node's ``gpu-offload.io/`` labels saying so (the donor chart's DaemonSet).

    python -m gpu_offload.liqo_peering.node_labeller [--once]

Reads ``NODE_NAME`` (the pod's ``spec.nodeName``), ``GPU_OFFLOAD_RUNTIME_CONFIG`` (the host's config.toml as
mounted; default below), ``GPU_OFFLOAD_DEVICE_PLUGIN_CONFIG`` (NVIDIA's device plugin config, for the sharing
mode; the node's allocatable resources tell MIG and a memory isolator) and ``GPU_OFFLOAD_LABEL_INTERVAL`` (seconds between passes, default 300).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from .errors import GpuOffloadError, api_error
from .gpu_labels import (
    LABELLED,
    UNPRIVILEGED_DEVICES,
    Device,
    NvmlAnswers,
    nvml_labels,
    runtime_labels,
    sharing_labels,
)
from .settings import read_donor

DEFAULT_RUNTIME_CONFIG = "/host/etc/nvidia-container-runtime/config.toml"
OWNED = (*LABELLED, UNPRIVILEGED_DEVICES)


def read_nvml() -> NvmlAnswers:
    """NVML's answers for this node, through pynvml (nvidia-ml-py)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuOffloadError(
            f"NVML cannot be initialised ({exc}): the labeller needs the NVIDIA driver's libnvidia-ml and the "
            "node's GPUs in its container; the donor chart mounts them through the NVIDIA runtime "
            "(labeller.runtimeClassName)"
        ) from exc
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mig: int | None = int(pynvml.nvmlDeviceGetMigMode(handle)[0])
            except pynvml.NVMLError_NotSupported:
                mig = None
            devices.append(Device(str(pynvml.nvmlDeviceGetName(handle)),
                                  int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), mig))
        return NvmlAnswers(str(pynvml.nvmlSystemGetDriverVersion()), int(pynvml.nvmlSystemGetCudaDriverVersion()),
                           tuple(devices))
    finally:
        pynvml.nvmlShutdown()


def read_runtime_config(path: str) -> str | None:
    """The runtime's config.toml, or None when it is not there."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def label_patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """A merge patch of the node's labels: ``wanted`` set, the labeller's other keys removed, the rest kept."""
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({k: None for k in OWNED if k in current and k not in wanted})
    return patch


def label_node(api_client: Any, node: str, wanted: Mapping[str, str],
               device_plugin_config: str | None = None) -> dict[str, str | None]:
    """Bring ``node``'s labels to ``wanted`` and the sharing mode its allocatable resources and
    ``device_plugin_config`` say (``gpu_labels.sharing_labels``); returns the patch sent (empty when nothing
    changed). A node without GPUs gets no sharing labels."""
    core = CoreV1Api(api_client)
    try:
        read = core.read_node(node)
        current = read.metadata.labels or {}
        allocatable = (read.status.allocatable if read.status else None) or {}
        if wanted:
            wanted = {**wanted, **sharing_labels(device_plugin_config, allocatable)}
        patch = label_patch(current, wanted)
        if patch:
            core.patch_node(node, {"metadata": {"labels": patch}})
    except ApiException as exc:
        raise api_error(exc, "labelling", f"Node {node}") from exc
    return patch


def _one_pass(api_client: Any, node: str, runtime_config: str, plugin_config: str | None) -> dict[str, str | None]:
    gpus = nvml_labels(read_nvml())
    wanted = {**gpus, **runtime_labels(read_runtime_config(runtime_config))}
    config = read_runtime_config(plugin_config) if plugin_config and gpus else None
    return label_node(api_client, node, wanted, config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_offload.liqo_peering.node_labeller",
                                     description="Keep this node's gpu-offload.io/ GPU labels current.")
    parser.add_argument("--once", action="store_true", help="label once and exit")
    args = parser.parse_args(argv)
    node = os.environ.get("NODE_NAME", "")
    if not node:
        print("node_labeller: NODE_NAME is not set; the donor chart sets it from the pod's spec.nodeName",
              file=sys.stderr)
        return 2
    from .client import api_client_from_environment

    settings = read_donor(os.environ)
    runtime_config = settings.runtime_config or DEFAULT_RUNTIME_CONFIG
    interval = settings.label_interval
    plugin_config = settings.device_plugin_config
    api_client = api_client_from_environment()
    while True:
        try:
            patch = _one_pass(api_client, node, runtime_config, plugin_config)
            print(f"node_labeller: {node}: {patch or 'labels current'}", flush=True)
        except GpuOffloadError as exc:
            print(f"node_labeller: {node}: {exc}", file=sys.stderr, flush=True)
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
