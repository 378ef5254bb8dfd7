"""The donor's GPU node labels: NVML's answers (data/nvml/) mapped to the gpu-offload.io/ labels the origin reads,
the runtime's handling of NVIDIA_VISIBLE_DEVICES from unprivileged pods, the Pod Security check, and the
labeller patching a Node through the sandbox's API server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import GpuOffloadError
from gpu_offload.liqo_peering.gpu_labels import (
    CUDA_VERSION,
    DRIVER_VERSION,
    GPU_COUNT,
    GPU_PRODUCT,
    MIG_MODE,
    UNPRIVILEGED_DEVICES,
    Device,
    NvmlAnswers,
    nvml_labels,
    pod_security_shortfall,
    runtime_labels,
    sharing_labels,
    shortfalls,
)
from gpu_offload.liqo_peering.node_labeller import label_node, label_patch, read_nvml

NVML = Path(__file__).parent / "data" / "nvml"


def _answers(name: str) -> NvmlAnswers:
    raw = json.loads((NVML / f"{name}.json").read_text())
    return NvmlAnswers(raw["driver_version"], raw["cuda_driver_version"],
                       tuple(Device(**d) for d in raw["devices"]))


EXPECTED = {
    "dgx-a100-80gb": {L.GPU_MODEL: "A100", GPU_PRODUCT: "A100-SXM4-80GB", L.GPU_MEMORY: "80Gi", GPU_COUNT: "8",
                      MIG_MODE: "disabled", DRIVER_VERSION: "535.161.08", CUDA_VERSION: "12.2"},
    "a100-pcie-mig": {L.GPU_MODEL: "A100", GPU_PRODUCT: "A100-PCIE-40GB", L.GPU_MEMORY: "40Gi", GPU_COUNT: "2",
                      MIG_MODE: "enabled", DRIVER_VERSION: "550.54.15", CUDA_VERSION: "12.4"},
    "tesla-t4": {L.GPU_MODEL: "T4", GPU_PRODUCT: "T4", L.GPU_MEMORY: "15Gi", GPU_COUNT: "1",
                 MIG_MODE: "unsupported", DRIVER_VERSION: "470.223.02", CUDA_VERSION: "11.4"},
    # two kinds of GPU on one node: no model or memory can be promised for "a GPU of this node"
    "h100-and-l4": {L.GPU_MODEL: "mixed", GPU_COUNT: "2", MIG_MODE: "mixed", DRIVER_VERSION: "550.90.07",
                    CUDA_VERSION: "12.4"},
    "geforce-rtx-4090": {L.GPU_MODEL: "RTX-4090", GPU_PRODUCT: "RTX-4090", L.GPU_MEMORY: "24Gi", GPU_COUNT: "1",
                         MIG_MODE: "unsupported", DRIVER_VERSION: "560.35.03", CUDA_VERSION: "12.6"},
}


@pytest.mark.parametrize("node", sorted(EXPECTED))
def test_nvml_answers_become_the_labels_the_origin_reads(node: str) -> None:
    assert nvml_labels(_answers(node)) == EXPECTED[node]


def test_the_recorded_answers_are_all_covered() -> None:
    assert {p.stem for p in NVML.glob("*.json")} == set(EXPECTED)


def test_every_label_is_a_valid_kubernetes_label_and_a_node_carrying_them_validates() -> None:
    value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    for node, labels in EXPECTED.items():
        for key, text in labels.items():
            assert value.match(text) and len(text) <= 63, (node, key, text)
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node,
                                      "labels": labels}}, "1.32.0", strict=True)


def test_a_hostile_device_name_still_yields_a_valid_label() -> None:
    labels = nvml_labels(NvmlAnswers("550.54.15", 12040, (Device("NVIDIA  A100/x; rm -rf " + "Z" * 80, 1, 0),)))
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", labels[GPU_PRODUCT])
    assert labels[L.GPU_MEMORY] == "1Gi"  # never "0Gi"


def test_a_node_without_gpus_gets_no_gpu_labels() -> None:
    assert nvml_labels(NvmlAnswers("550.54.15", 12040, ())) == {}


@pytest.mark.parametrize("text, seen", [
    ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", "ignored"),
    ("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", "accepted"),
    # the runtime's default is to honour the variable: a config that does not say so is not safe
    ("disable-require = false\n[nvidia-container-cli]\nldconfig = \"@/sbin/ldconfig\"\n", "accepted"),
    ("accept-nvidia-visible-devices-envvar-when-unprivileged = \n", "unknown"),
    (None, "unknown"),
])
def test_the_runtime_setting_for_unprivileged_pods_is_read_from_its_config(text: str | None, seen: str) -> None:
    assert runtime_labels(text) == {UNPRIVILEGED_DEVICES: seen}


def _namespace(level: str | None) -> dict[str, Any]:
    labels = {} if level is None else {"pod-security.kubernetes.io/enforce": level}
    return {"metadata": {"name": "jhub-alice-origin", "labels": labels}}


def test_the_pod_security_check_names_what_to_set() -> None:
    assert pod_security_shortfall(_namespace("restricted"), "baseline") is None
    assert pod_security_shortfall(_namespace("baseline"), "baseline") is None
    below = pod_security_shortfall(_namespace("baseline"), "restricted")
    assert below == ("namespace jhub-alice-origin enforces baseline, less than the restricted the origin expects; "
                     "set it to restricted")
    unset = pod_security_shortfall(_namespace(None), "baseline")
    assert unset is not None and "enforces no Pod Security level" in unset and "privileged" in unset
    assert shortfalls([_namespace("privileged"), _namespace("restricted")], "baseline") == [
        "namespace jhub-alice-origin enforces privileged, less than the baseline the origin expects; set it to "
        "baseline"]
    with pytest.raises(ValueError, match="use one of privileged, baseline, restricted"):
        pod_security_shortfall(_namespace("baseline"), "strict")


def test_the_patch_sets_removes_only_the_labellers_keys() -> None:
    current = {L.GPU_MODEL: "V100", GPU_PRODUCT: "V100-SXM2-32GB", "kubernetes.io/hostname": "gpu-1",
               UNPRIVILEGED_DEVICES: "ignored"}
    wanted = {**EXPECTED["tesla-t4"]}
    del wanted[GPU_PRODUCT]
    patch = label_patch(current, wanted)
    assert patch[L.GPU_MODEL] == "T4" and patch[GPU_PRODUCT] is None and patch[UNPRIVILEGED_DEVICES] is None
    assert "kubernetes.io/hostname" not in patch
    assert label_patch({**current, **wanted, UNPRIVILEGED_DEVICES: "ignored"},
                       {**wanted, UNPRIVILEGED_DEVICES: "ignored"}) == {GPU_PRODUCT: None}


def test_nvml_without_a_driver_is_refused_naming_what_is_missing() -> None:
    """This machine has no NVIDIA driver: the real pynvml fails to initialise, and the labeller says why."""
    with pytest.raises(GpuOffloadError, match=r"NVML cannot be initialised .*libnvidia-ml"):
        read_nvml()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from gpu_offload.sandbox.testing import running_sandbox

    with running_sandbox(tmp_path_factory.mktemp("api")) as running:
        yield running


def test_the_labeller_brings_a_nodes_labels_to_what_nvml_says(sandbox: Any) -> None:
    api_client = sandbox.api_client()
    core = kubernetes.client.CoreV1Api(api_client)
    core.create_node({"metadata": {"name": "gpu-1", "labels": {"kubernetes.io/hostname": "gpu-1",
                                                                L.GPU_MODEL: "V100", GPU_PRODUCT: "V100-SXM2-32GB"}}})
    wanted = {**nvml_labels(_answers("h100-and-l4")), **runtime_labels("accept-nvidia-visible-devices-envvar-"
                                                                       "when-unprivileged = false\n")}
    label_node(api_client, "gpu-1", wanted)
    labels = core.read_node("gpu-1").metadata.labels
    assert labels == {"kubernetes.io/hostname": "gpu-1", **wanted, L.GPU_SHARING: "none", L.GPU_REPLICAS: "1"}
    assert label_node(api_client, "gpu-1", wanted) == {}  # a second pass changes nothing


TIME_SLICING = """version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@pytest.mark.parametrize(("config", "allocatable", "mode", "replicas"), [
    (TIME_SLICING, {"nvidia.com/gpu.shared": "8"}, "time-slicing", "4"),
    (TIME_SLICING.replace("timeSlicing", "mps"), {"nvidia.com/gpu.shared": "8"}, "mps", "4"),
    (None, {"nvidia.com/mig-1g.10gb": "7"}, "mig", "1"),
    (None, {"nvidia.com/gpu": "20", "nvidia.com/gpumem": "163840"}, "memory", "1"),
    (None, {"nvidia.com/gpu": "2"}, "none", "1"),
    ("sharing: [unclosed", {"nvidia.com/gpu": "2"}, "none", "1"),
    (TIME_SLICING.replace("replicas: 4", "replicas: '4; rm -rf'"), {"nvidia.com/gpu": "2"}, "none", "1"),
])
def test_the_sharing_mode_comes_from_the_device_plugin_config_and_the_nodes_resources(
        config: str | None, allocatable: dict[str, str], mode: str, replicas: str) -> None:
    assert sharing_labels(config, allocatable) == {L.GPU_SHARING: mode, L.GPU_REPLICAS: replicas}


def test_the_labeller_reports_the_sharing_mode_of_a_time_sliced_node(sandbox: Any) -> None:
    api_client = sandbox.api_client()
    core = kubernetes.client.CoreV1Api(api_client)
    core.create_node({"metadata": {"name": "gpu-2", "labels": {"kubernetes.io/hostname": "gpu-2"}}})
    core.patch_node_status("gpu-2", {"status": {"capacity": {"nvidia.com/gpu.shared": "8"},
                                                "allocatable": {"nvidia.com/gpu.shared": "8"}}})
    wanted = nvml_labels(_answers("h100-and-l4"))
    label_node(api_client, "gpu-2", wanted, TIME_SLICING)
    labels = core.read_node("gpu-2").metadata.labels
    assert (labels[L.GPU_SHARING], labels[L.GPU_REPLICAS]) == ("time-slicing", "4")
    label_node(api_client, "gpu-2", wanted, None)  # the config gone (sharing turned off): the labels follow
    assert core.read_node("gpu-2").metadata.labels[L.GPU_SHARING] == "none"
