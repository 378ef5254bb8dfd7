"""What a donor's GPU node says about its GPUs, as node labels: NVML's answers in, ``gpu-offload.io/`` labels out.

Pure: the donor's node labeller (``node_labeller``) asks NVML through pynvml and patches its node with the
result; the origin reads the same keys on virtual nodes (``labels.GPU_MODEL``, ``labels.GPU_MEMORY``, ...). Also
here: what the node's NVIDIA container runtime does with ``NVIDIA_VISIBLE_DEVICES`` from unprivileged pods,
read from its config.toml, and whether a namespace's Pod Security level is the one the origin expects.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tomllib
import yaml

from . import labels as L
from .sharing import MAX_REPLICAS, MEMORY_RESOURCE, MIG_PREFIX

GPU_PRODUCT = L.PREFIX + "gpu-product"
"""The full product name, e.g. ``A100-SXM4-80GB`` (the model label keeps the family, ``A100``)."""
GPU_COUNT = L.PREFIX + "gpu-count"
MIG_MODE = L.PREFIX + "gpu-mig"
"""``enabled``, ``disabled`` or ``unsupported`` (``mixed`` when the node's GPUs differ)."""
DRIVER_VERSION = L.PREFIX + "gpu-driver"
CUDA_VERSION = L.PREFIX + "gpu-cuda"
"""The newest CUDA the driver supports, ``major.minor``."""
UNPRIVILEGED_DEVICES = L.PREFIX + "unprivileged-visible-devices"
"""``ignored`` when the runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged pods (as a donor must),
``accepted`` when it honours it (any pod can then see every GPU of the node), ``unknown`` without its config."""

LABELLED = (L.GPU_MODEL, GPU_PRODUCT, L.GPU_MEMORY, GPU_COUNT, MIG_MODE, DRIVER_VERSION, CUDA_VERSION, L.GPU_SHARING,
            L.GPU_REPLICAS)
"""Every key the labeller owns: it removes those it no longer finds (a GPU taken out, a driver change)."""

_MIG = {0: "disabled", 1: "enabled"}
_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Device:
    """One GPU as NVML describes it."""

    name: str
    """``nvmlDeviceGetName``, e.g. ``NVIDIA A100-SXM4-80GB``."""
    memory_total: int
    """``nvmlDeviceGetMemoryInfo(...).total``, in bytes."""
    mig_mode: int | None
    """The current mode of ``nvmlDeviceGetMigMode`` (1 enabled, 0 disabled); None where NVML says the GPU does
    not support MIG."""


@dataclass(frozen=True)
class NvmlAnswers:
    """NVML's answers for one node."""

    driver_version: str
    """``nvmlSystemGetDriverVersion``, e.g. ``550.54.15``."""
    cuda_driver_version: int
    """``nvmlSystemGetCudaDriverVersion``: 1000 * major + 10 * minor, e.g. 12040 for 12.4."""
    devices: tuple[Device, ...]


def label_value(text: str) -> str:
    """``text`` as a valid label value (63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends)."""
    return _VALUE.sub("-", text).strip("-._")[:63].rstrip("-._")


def product(name: str) -> str:
    """NVML's device name without the vendor's words: ``NVIDIA A100-SXM4-80GB`` -> ``A100-SXM4-80GB``,
    ``Tesla T4`` -> ``T4``, ``NVIDIA GeForce RTX 4090`` -> ``RTX-4090``."""
    words = [w for w in name.split() if w.lower() not in {"nvidia", "tesla", "geforce", "quadro"}]
    return label_value("-".join(words) or name)


def model(name: str) -> str:
    """The family the origin's profiles and ``--gpu-model`` name: the product up to its form factor or memory
    (``A100-SXM4-80GB`` -> ``A100``, ``H100 80GB HBM3`` -> ``H100``, ``RTX-4090`` stays)."""
    full = product(name)
    parts = full.split("-")
    if len(parts) > 1 and parts[0].isalpha():  # "RTX-4090", "RTX-A6000": the family is two words
        return "-".join(parts[:2])
    return parts[0]


def memory(total: int) -> str:
    """One GPU's memory as a quantity in whole GiB, rounded to the nearest (drivers reserve a little)."""
    return f"{max(1, round(total / 2**30))}Gi"


def nvml_labels(answers: NvmlAnswers) -> dict[str, str]:
    """The node's GPU labels; a node without GPUs gets none (the labeller then removes any it set before)."""
    devices = answers.devices
    if not devices:
        return {}
    products = Counter(product(d.name) for d in devices)
    mig = {_MIG.get(d.mig_mode, "unsupported") if d.mig_mode is not None else "unsupported" for d in devices}
    labels = {
        GPU_COUNT: str(len(devices)),
        MIG_MODE: mig.pop() if len(mig) == 1 else "mixed",
        DRIVER_VERSION: label_value(answers.driver_version),
        CUDA_VERSION: f"{answers.cuda_driver_version // 1000}.{answers.cuda_driver_version % 1000 // 10}",
    }
    if len(products) == 1:
        # one kind of GPU: the origin can promise its model and memory
        labels[GPU_PRODUCT] = next(iter(products))
        labels[L.GPU_MODEL] = model(devices[0].name)
        labels[L.GPU_MEMORY] = memory(min(d.memory_total for d in devices))
    else:
        labels[L.GPU_MODEL] = "mixed"
    return labels


def runtime_labels(config_toml: str | None) -> dict[str, str]:
    """What the node's nvidia-container-runtime config.toml does with NVIDIA_VISIBLE_DEVICES from unprivileged
    pods. Its default (the key absent) is to honour it, so only an explicit ``false`` counts as ignored."""
    if config_toml is None:
        return {UNPRIVILEGED_DEVICES: "unknown"}
    try:
        parsed = tomllib.loads(config_toml)
    except tomllib.TOMLDecodeError:
        return {UNPRIVILEGED_DEVICES: "unknown"}
    accepted = parsed.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True)
    return {UNPRIVILEGED_DEVICES: "accepted" if accepted is not False else "ignored"}


POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
POD_SECURITY_ORDER = ("privileged", "baseline", "restricted")


def pod_security_shortfall(namespace: Mapping[str, object], expected: str) -> str | None:
    """Why the pods of ``namespace`` (a Namespace object) may run with less isolation than ``expected``
    (``baseline`` or ``restricted``); None when its enforced level is at least that."""
    if expected not in POD_SECURITY_ORDER:
        raise ValueError(f"Pod Security level {expected!r}: use one of {', '.join(POD_SECURITY_ORDER)}")
    metadata = namespace.get("metadata")
    meta = metadata if isinstance(metadata, Mapping) else {}
    labels = meta.get("labels")
    level = (labels if isinstance(labels, Mapping) else {}).get(POD_SECURITY_ENFORCE)
    name = meta.get("name", "?")
    if level is None:
        return (f"namespace {name} enforces no Pod Security level (label {POD_SECURITY_ENFORCE} absent, so the "
                f"cluster's default applies, privileged unless configured); set it to {expected}")
    if level not in POD_SECURITY_ORDER:
        return f"namespace {name} has {POD_SECURITY_ENFORCE}={level!r}, not a level; set it to {expected}"
    if POD_SECURITY_ORDER.index(str(level)) < POD_SECURITY_ORDER.index(expected):
        return f"namespace {name} enforces {level}, less than the {expected} the origin expects; set it to {expected}"
    return None


def shortfalls(namespaces: Sequence[Mapping[str, object]], expected: str) -> list[str]:
    """Every namespace of ``namespaces`` below ``expected``, each saying what to set."""
    return [s for s in (pod_security_shortfall(n, expected) for n in namespaces) if s]


def _replicas(section: object) -> int | None:
    """The replicas of ``nvidia.com/gpu`` in a device plugin ``sharing.timeSlicing`` or ``sharing.mps`` section."""
    resources = section.get("resources") if isinstance(section, Mapping) else None
    for entry in resources if isinstance(resources, list) else []:
        if isinstance(entry, Mapping) and entry.get("name") == "nvidia.com/gpu":
            replicas = entry.get("replicas")
            if type(replicas) is int and 1 <= replicas <= MAX_REPLICAS:
                return replicas
    return None


def sharing_labels(device_plugin_config: str | None, allocatable: Mapping[str, object]) -> dict[str, str]:
    """How the node shares its GPUs, from NVIDIA's device plugin config (YAML, as the donor chart mounts it) and
    the node's allocatable resources: a memory isolator's ``nvidia.com/gpumem``, then MPS or time-slicing
    replicas of ``nvidia.com/gpu`` (``sharing.mps`` / ``sharing.timeSlicing``), then MIG profiles offered as
    resources (strategy ``mixed``); else ``none``. A config that does not parse counts as absent."""
    if MEMORY_RESOURCE in allocatable:
        return {L.GPU_SHARING: "memory", L.GPU_REPLICAS: "1"}
    try:
        config = yaml.safe_load(device_plugin_config) if device_plugin_config else None
    except yaml.YAMLError:
        config = None
    sharing = config.get("sharing") if isinstance(config, Mapping) else None
    if isinstance(sharing, Mapping):
        for key, mode in (("mps", "mps"), ("timeSlicing", "time-slicing")):
            replicas = _replicas(sharing.get(key))
            if replicas is not None and replicas > 1:
                return {L.GPU_SHARING: mode, L.GPU_REPLICAS: str(replicas)}
    if any(str(name).startswith(MIG_PREFIX) for name in allocatable):
        return {L.GPU_SHARING: "mig", L.GPU_REPLICAS: "1"}
    return {L.GPU_SHARING: "none", L.GPU_REPLICAS: "1"}
