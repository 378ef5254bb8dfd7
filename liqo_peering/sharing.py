"""What a fraction of a GPU becomes on a donor: the pure mapping from a request to a resource ask.

Kubernetes extended resources are whole numbers, so ``--gpus 0.5`` or ``--gpu-memory 12Gi`` can only be asked
for in the units a donor advertises. Donors share GPUs in one of four ways (the donor's labeller reports
which, see ``GpuOffer``):

- **time-slicing** and **MPS** (NVIDIA's device plugin ``sharing.timeSlicing`` / ``sharing.mps``): each GPU is
  offered as ``replicas`` shares of one resource. A fraction asks for ``ceil(f * replicas)`` shares, and never
  for more shares than one GPU has, since the device plugin may hand out shares of two GPUs for one request
  and a cell asking for half a GPU must not get two quarters of different GPUs. Time-slicing isolates
  nothing; MPS caps memory per client (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and compute.
- **MIG**: each profile is its own resource (``nvidia.com/mig-1g.10gb``); the smallest profile whose memory
  covers the request is asked for; memory and compute are isolated by the hardware.
- **memory**: a GPU memory isolator (HAMi's ``nvidia.com/gpumem``) next to ``nvidia.com/gpu: 1``.
- **none**: whole GPUs only; a fraction is refused with the reason, so placement can say which donors share.

Dynamic Resource Allocation (ResourceClaims) would express fractions directly, but Liqo does not reflect
ResourceClaims to donors today; ``ResourceAsk`` is the seam a claim-based ask would come through.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from . import environment as E
from . import labels as L
from .errors import CannotShare, InvalidRequest

SharingMode = Literal["none", "time-slicing", "mps", "mig", "memory"]
SHARING_MODES: tuple[SharingMode, ...] = ("none", "time-slicing", "mps", "mig", "memory")
Isolation = Literal["none", "memory", "compute and memory"]
GIB = 2**30
MIB = 2**20
GPU = "nvidia.com/gpu"
GPU_VENDOR = "nvidia.com/"
SHARED_GPU = "nvidia.com/gpu.shared"
"""The resource NVIDIA's device plugin offers shares as when it renames them (``renameByDefault``)."""
MIG_PREFIX = "nvidia.com/mig-"
MEMORY_RESOURCE = "nvidia.com/gpumem"
MAX_REPLICAS = 1024
ISOLATION: dict[str, Isolation] = {"none": "compute and memory", "time-slicing": "none", "mps": "compute and memory",
                                   "mig": "compute and memory", "memory": "memory"}
"""What a pod holding part of a GPU in each mode is isolated from its neighbours by (a whole GPU: everything)."""
_MIG_NAME = re.compile(r"^([1-7])g\.([1-9][0-9]{0,3})gb$")


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile a donor offers, e.g. ``1g.10gb`` with 10 GiB of GPU memory."""

    name: str
    memory: int
    """Bytes of GPU memory the profile holds."""
    compute: float
    """Share of the GPU's compute slices, e.g. 1/7 for ``1g``."""

    @property
    def resource(self) -> str:
        return f"nvidia.com/mig-{self.name}"


@dataclass(frozen=True)
class GpuOffer:
    """How one donor's GPUs of one model are offered, as its labeller reports them."""

    mode: SharingMode = "none"
    memory: int | None = None
    """Bytes of memory of one whole GPU; None when the donor did not say."""
    replicas: int = 1
    """Shares per GPU under time-slicing or MPS."""
    resource: str = GPU
    """The resource the shares are offered as (NVIDIA's plugin can rename them, e.g. ``nvidia.com/gpu.shared``)."""
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    memory_resource: str = "nvidia.com/gpumem"
    """Under ``memory``: the isolator's resource, counted in MiB."""


@dataclass(frozen=True)
class FractionRequest:
    """What a cell asked for: a share of one GPU, GPU memory, or both (the larger need wins)."""

    gpus: float = 1.0
    memory: int | None = None
    """Bytes of GPU memory the cell needs; None: derived from ``gpus`` and the GPU's memory."""

    def __post_init__(self) -> None:
        if not (self.gpus > 0) or math.isinf(self.gpus):
            raise InvalidRequest(f"--gpus {self.gpus} is not a positive number; ask e.g. --gpus 0.5 or --gpus 2")
        if self.gpus > 1 and self.gpus != int(self.gpus):
            raise InvalidRequest(
                f"--gpus {self.gpus} mixes whole GPUs and a fraction; ask for whole GPUs (--gpus "
                f"{math.ceil(self.gpus)}) or a fraction of one (at most 1)"
            )
        if self.memory is not None and self.memory <= 0:
            raise InvalidRequest(f"--gpu-memory {self.memory} is not positive; give a size such as 12Gi")

    @property
    def whole(self) -> bool:
        return self.memory is None and self.gpus == int(self.gpus)


@dataclass(frozen=True)
class ResourceAsk:
    """The resources a pod asks a donor for, the share of a GPU it holds, and the isolation it gets."""

    resources: tuple[tuple[str, int], ...]
    share: float
    """Fraction of one GPU held (billing and quota count this); whole GPUs give their count."""
    isolation: Isolation
    memory_limit: int | None = None
    """Bytes the runner caps its own use at (MPS pinned limit, torch's per-process fraction); None: no cap."""
    mode: str = "none"
    """The donor's sharing mode the ask was made for."""

    @property
    def limits(self) -> dict[str, int]:
        return dict(self.resources)

    def runner_env(self) -> dict[str, str]:
        """What the runner is told (docs/runner-protocol.md): the mode, the isolation the pod gets, and the
        memory it caps its own use at and watches (its bytes, else the share of the GPU it holds)."""
        env = {RUNNER_SHARING: self.mode, RUNNER_ISOLATION: self.isolation}
        if self.memory_limit:
            env[RUNNER_MEMORY_LIMIT] = str(self.memory_limit)
        elif self.share < 1:  # e.g. time-slicing shares of a GPU whose memory the donor did not say
            env[RUNNER_FRACTION] = format(self.share, "g")
        return env

    def describe(self) -> str:
        """One phrase for the placement notice, e.g. ``0.5 of a GPU (time-slicing: 2 of 4 shares; isolation:
        none)``."""
        held = ", ".join(f"{n} {r}" for r, n in self.resources)
        part = "a whole GPU" if self.share == 1 else f"{self.share:.3g} of a GPU"
        return f"{part} ({self.mode}: {held}; isolation: {self.isolation})"


RUNNER_SHARING = E.GPU_SHARING.name
RUNNER_ISOLATION = E.GPU_ISOLATION.name
RUNNER_MEMORY_LIMIT = E.GPU_MEMORY_LIMIT.name
RUNNER_FRACTION = E.GPU_FRACTION.name
"""Set from ``--gpus 0.5`` instead of a byte limit: the share of the GPU the runner caps itself at."""


def _needed_share(request: FractionRequest, offer: GpuOffer) -> float:
    """The share of one GPU the request needs: its fraction, or its memory over the GPU's, whichever is larger."""
    share = min(request.gpus, 1.0)
    if request.memory is not None:
        if offer.memory is None:
            raise CannotShare(
                "--gpu-memory needs to know the donor's GPU memory, and this donor's GPUs carry no memory "
                "label; ask for a fraction with --gpus instead, or ask the donor's admin to run the labeller"
            )
        share = max(share if request.gpus < 1 else 0.0, request.memory / offer.memory)
        if share > 1:
            raise CannotShare(
                f"--gpu-memory {request.memory / GIB:.1f} GiB is more than one GPU here holds "
                f"({offer.memory / GIB:.1f} GiB); ask for less, or choose a larger --gpu-model"
            )
    return share


def resource_ask(request: FractionRequest, offer: GpuOffer) -> ResourceAsk:
    """Turn a request into what a donor with ``offer`` can grant, or raise CannotShare saying why it cannot."""
    if request.whole:
        count = int(request.gpus)
        if offer.mode == "memory":
            return _whole_on_isolator(count, offer)
        return ResourceAsk(((GPU, count),), float(count), "compute and memory")
    share = _needed_share(request, offer)
    if offer.mode == "none":
        raise CannotShare(
            "this donor lends whole GPUs only (no time-slicing, MPS, MIG or memory isolation); ask for "
            "--gpus 1, or choose a donor that shares GPUs (`gpu-offload doctor` lists each donor's sharing mode)"
        )
    if offer.mode in ("time-slicing", "mps"):
        if offer.replicas < 2:
            raise CannotShare(f"this donor's {offer.mode} offers {offer.replicas} share per GPU; ask for --gpus 1")
        shares = min(offer.replicas, math.ceil(share * offer.replicas - 1e-9))
        if offer.mode == "time-slicing":
            return ResourceAsk(((offer.resource, shares),), shares / offer.replicas, "none", mode="time-slicing")
        return _mps_ask(shares, offer)
    if offer.mode == "mig":
        return _mig_ask(share, offer)
    if offer.memory is None:
        raise CannotShare("this donor isolates GPU memory but did not say how much one GPU holds; ask for --gpus 1")
    mib = math.ceil(share * offer.memory / MIB)
    return ResourceAsk(((GPU, 1), (offer.memory_resource, mib)), mib * MIB / offer.memory, "memory", mib * MIB,
                       mode="memory")


def _mps_ask(shares: int, offer: GpuOffer) -> ResourceAsk:
    """One MPS share, the only size an MPS donor grants. NVIDIA's k8s-device-plugin always turns on
    ``sharing.mps.failRequestsGreaterThanOne`` (its config loader forces it, since v0.15.0), so its Allocate
    refuses a container asking for more than one replica (``UnexpectedAdmissionError``, "maximum request size
    for shared resources is 1"), and its MPS daemon pins every client to the GPU's memory over the replicas:
    two shares would not give a pod twice the memory even if they were granted."""
    if shares > 1:
        size = f" of {offer.memory / offer.replicas / GIB:.3g} GiB" if offer.memory else ""
        raise CannotShare(
            f"this donor shares each GPU by MPS as {offer.replicas} parts{size}; one pod gets one part; ask for "
            f"--gpus 1/{offer.replicas} or less, or a donor with time-slicing, MIG or a memory isolator"
        )
    held = 1 / offer.replicas
    limit = int(held * offer.memory) if offer.memory else None
    return ResourceAsk(((offer.resource, 1),), held, "compute and memory", limit, mode="mps")


def _whole_on_isolator(count: int, offer: GpuOffer) -> ResourceAsk:
    """A whole GPU of a donor whose ``nvidia.com/gpu`` counts a memory isolator's slots: one slot and all of
    the GPU's memory, so no other pod fits beside it. Only one: an isolator counts its memory per GPU (HAMi's
    ``nvidia.com/gpumem`` is per device) while a node's quota counts it in total, so two GPUs' memory in one
    ask would mean different things to the two."""
    if count != 1:
        raise CannotShare(f"this donor lends GPUs through a memory isolator, one whole GPU per pod; ask for "
                          f"--gpus 1, or for --gpus {count} on a donor that lends whole GPUs")
    if offer.memory is None:
        raise CannotShare("this donor isolates GPU memory but did not say how much one GPU holds, so a whole "
                          "GPU cannot be asked of it; ask its admin to run the labeller")
    mib = math.ceil(offer.memory / MIB)
    return ResourceAsk(((GPU, 1), (offer.memory_resource, mib)), 1.0, "compute and memory", mode="memory")


def _mig_ask(share: float, offer: GpuOffer) -> ResourceAsk:
    if not offer.mig_profiles or offer.memory is None:
        raise CannotShare("this donor runs MIG but reported no profiles; ask its admin to run the labeller")
    needed = share * offer.memory
    fitting = sorted((p for p in offer.mig_profiles if p.memory >= needed - 1), key=lambda p: (p.memory, p.name))
    if not fitting:
        largest = max(offer.mig_profiles, key=lambda p: p.memory)
        raise CannotShare(
            f"no MIG profile here holds {needed / GIB:.1f} GiB (the largest, {largest.name}, holds "
            f"{largest.memory / GIB:.1f} GiB); ask for less memory or a whole GPU"
        )
    profile = fitting[0]
    return ResourceAsk(((profile.resource, 1),), profile.memory / offer.memory, "compute and memory",
                       profile.memory, mode="mig")


def mig_profile(name: str) -> MigProfile | None:
    """A MIG profile from its name as the device plugin's resource carries it (``1g.10gb``: one of seven
    compute slices, 10 GB), or None when the name is not a profile's. The memory is read from the name."""
    found = _MIG_NAME.match(name)
    if found is None:
        return None
    return MigProfile(name, int(found.group(2)) * GIB, int(found.group(1)) / 7)


def offer_from_node(labels: Mapping[str, str], resources: Iterable[str], memory: int | None,
                    where: str = "node") -> GpuOffer:
    """How a (virtual) node lends its GPUs: the mode and replicas its labels say (``labels.GPU_SHARING``,
    ``labels.GPU_REPLICAS``), the resources it offers (shares may be renamed ``nvidia.com/gpu.shared``; MIG
    profiles are resources ``nvidia.com/mig-<profile>``), and the memory of one GPU.

    Labels are the donor's word: a value outside the known modes or a replica count that is not a number from 1
    to 1024 raises ValueError naming ``where`` and the label, never a guess."""
    mode = labels.get(L.GPU_SHARING, "none")
    if mode not in SHARING_MODES:
        raise ValueError(f"{where}: {L.GPU_SHARING}={mode[:40]!r} is not a sharing mode; use one of "
                         f"{', '.join(SHARING_MODES)}")
    raw = labels.get(L.GPU_REPLICAS, "1")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_REPLICAS:
        raise ValueError(f"{where}: {L.GPU_REPLICAS}={raw[:40]!r} is not a number of shares from 1 to {MAX_REPLICAS}")
    names = set(resources)
    profiles = tuple(sorted((p for p in (mig_profile(n[len(MIG_PREFIX):]) for n in names if n.startswith(MIG_PREFIX))
                             if p is not None), key=lambda p: (p.memory, p.name)))
    return GpuOffer(mode=mode,  # type: ignore[arg-type]  # checked against SHARING_MODES above
                    memory=memory, replicas=int(raw), resource=SHARED_GPU if SHARED_GPU in names else GPU,
                    mig_profiles=profiles)


def held_share(limits: Mapping[str, int], offer: GpuOffer) -> float:
    """The GPUs a pod with these GPU resources holds on a node lending as ``offer``: shares over replicas under
    time-slicing or MPS, a MIG profile's memory over the GPU's, an isolator's MiB over the GPU's; whole GPUs
    count one each. Billing and quotas count this."""
    held = 0.0
    for resource, count in limits.items():
        if count <= 0:
            continue
        if offer.mode in ("time-slicing", "mps") and resource == offer.resource:
            held += count / offer.replicas
        elif resource.startswith(MIG_PREFIX):
            profile = mig_profile(resource[len(MIG_PREFIX):])
            held += count * (profile.memory / offer.memory if profile and offer.memory else 1.0)
        elif resource == GPU and offer.mode != "memory":
            held += count
    if offer.mode == "memory" and offer.memory:
        mib = limits.get(offer.memory_resource, 0)
        held += min(1.0, mib * MIB / offer.memory) if mib > 0 else float(limits.get(GPU, 0))
    return held
