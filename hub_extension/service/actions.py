"""The admin actions as validated, frozen requests, and the patches they become. Pure: no I/O here.

A form (or JSON body) is turned into one of these with ``parse_action``; anything malformed is refused
with an ``InvalidRequest`` naming the field and what would be accepted, before anything is sent. Each
action can describe itself in words, which is what the confirmation page and the audit log show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import InvalidRequest
from kubernetes.utils import parse_quantity

from .kubeconfigs import check_kubeconfig

# fullmatch and ASCII throughout: "\d" alone also matches digits such as "²" or "٣", and "$" a final newline.
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", re.ASCII)
_PRICE = re.compile(r"\d{1,6}(\.\d{1,4})?", re.ASCII)
_GPUS = re.compile(r"\d{1,4}", re.ASCII)
# Kubernetes' quantity grammar (sign, number, then a binary or decimal suffix or a short exponent); anything
# else the API server would refuse only after the confirmation.
_QUANTITY = re.compile(r"[+-]?(\d{1,18}(\.\d{0,9})?|\.\d{1,9})([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d{1,2})?", re.ASCII)
MAX_GPUS = 1024
"""Upper bound on one slice's GPUs: a typo guard (nobody lends more through one slice)."""


def _shown(value: object) -> str:
    """A submitted value as an error message repeats it: quoted, and cut short."""
    text = str(value)
    return repr(text if len(text) <= 64 else text[:64] + "...")


def _name(value: str, field: str, pattern: re.Pattern[str], longest: int, rule: str) -> str:
    """``value`` if it is non-empty, at most ``longest`` characters and matches ``pattern``; else says ``rule``."""
    if not value or len(value) > longest or not pattern.fullmatch(value):
        raise InvalidRequest(f"{field} {_shown(value)} is not {rule}")
    return value


def dns_label(value: str, field: str) -> str:
    """``value`` if it is a DNS-1123 label (Kubernetes names of namespaces, cluster ids, ...)."""
    return _name(value, field, _DNS_1123_LABEL, 63, "a DNS-1123 label: use lowercase letters, digits and '-', "
                 "starting and ending with a letter or digit, at most 63 characters (e.g. donor-1)")


def dns_subdomain(value: str, field: str) -> str:
    """``value`` if it is a DNS-1123 subdomain (names of nodes and most objects)."""
    return _name(value, field, _DNS_1123_SUBDOMAIN, 253, "a DNS-1123 name: lowercase letters, digits, '-' and '.', "
                 "at most 253 characters (e.g. donor-1-gpu)")


def gpu_count(raw: Any, field: str = "gpus") -> int:
    """A whole number of GPUs between 1 and ``MAX_GPUS``."""
    text = str(raw).strip()
    if not _GPUS.fullmatch(text) or not 1 <= int(text) <= MAX_GPUS:
        raise InvalidRequest(f"{field}={_shown(raw)}: give a whole number of GPUs from 1 to {MAX_GPUS} (e.g. 4)")
    return int(text)


def quantity(raw: Any, field: str) -> str | None:
    """An optional Kubernetes resource quantity (``8``, ``500m``, ``64Gi``); empty means none."""
    text = str(raw or "").strip()
    if not text:
        return None
    if not _QUANTITY.fullmatch(text):
        raise InvalidRequest(f"{field}={_shown(text)} is not a resource quantity: write e.g. 8, 500m or 64Gi")
    if parse_quantity(text) <= 0:
        raise InvalidRequest(f"{field}={_shown(text)} must be more than zero")
    return text


def label_value(raw: Any, field: str) -> str:
    """A Kubernetes label value (GPU model names like ``A100-80GB``)."""
    return _name(str(raw or "").strip(), field, _LABEL_VALUE, 63, "a label value: letters, digits, '-', '_' and "
                 "'.', at most 63 characters, starting and ending with a letter or digit (e.g. A100)")


def price(raw: Any, field: str = "price") -> str:
    """A non-negative decimal price per GPU-hour, as a label value (``2.5``)."""
    text = str(raw or "").strip()
    if not _PRICE.fullmatch(text):
        raise InvalidRequest(f"{field}={_shown(text)}: give a decimal number such as 2.5 (digits, one dot, no currency)")
    return text


def tenant_namespace(cluster_id: str) -> str:
    """Liqo's tenant namespace for a peer (where its ResourceSlices and VirtualNodes live)."""
    return f"liqo-tenant-{cluster_id}"


@dataclass(frozen=True)
class SliceRequest:
    """Request a GPU ResourceSlice from a peer, or resize the one of that name."""

    cluster_id: str
    gpus: int
    name: str
    cpu: str | None = None
    memory: str | None = None

    kind = "resourceslice"

    def describe(self) -> str:
        """The action in words."""
        extra = "".join(f", {k} {v}" for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v)
        return (f"request {self.gpus} GPU(s){extra} from cluster {self.cluster_id} with ResourceSlice "
                f"{tenant_namespace(self.cluster_id)}/{self.name} (resized if it exists)")

    def form_fields(self) -> dict[str, str]:
        """The form fields that ask for this action again (what the confirmation page carries)."""
        extra = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v}
        return {"cluster_id": self.cluster_id, "gpus": str(self.gpus), "name": self.name, **extra}

    def resize_patch(self) -> dict[str, Any]:
        """The merge patch resizing an existing slice: only its requested resources change."""
        resources: dict[str, Any] = {L.GPU_RESOURCE: str(self.gpus)}
        resources.update({k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v})
        return {"spec": {"resources": resources}}


@dataclass(frozen=True)
class NodeLabels:
    """Set a virtual node's GPU model and price labels (on its VirtualNode; Liqo copies them to the node)."""

    cluster_id: str
    node: str
    model: str
    price: str

    kind = "label"

    def describe(self) -> str:
        """The action in words."""
        return f"label virtual node {self.node} (cluster {self.cluster_id}): GPU model {self.model}, {self.price} per GPU-hour"

    def form_fields(self) -> dict[str, str]:
        """The form fields that ask for this action again (what the confirmation page carries)."""
        return {"cluster_id": self.cluster_id, "node": self.node, "model": self.model, "price": self.price}

    def patch(self) -> dict[str, Any]:
        """Merge patch for the VirtualNode."""
        return {"spec": {"labels": {L.GPU_MODEL: self.model, L.PRICE_PER_GPU_HOUR: self.price}}}


@dataclass(frozen=True)
class Cordon:
    """Take a virtual node out of placement (running runs finish), or put it back."""

    cluster_id: str
    node: str
    cordon: bool

    @property
    def kind(self) -> str:
        """``cordon`` or ``uncordon``."""
        return "cordon" if self.cordon else "uncordon"

    def describe(self) -> str:
        """The action in words."""
        if self.cordon:
            return f"cordon virtual node {self.node} (cluster {self.cluster_id}): new runs avoid it, running runs finish"
        return f"uncordon virtual node {self.node} (cluster {self.cluster_id}): placement may choose it again"

    def form_fields(self) -> dict[str, str]:
        """The form fields that ask for this action again (what the confirmation page carries)."""
        return {"cluster_id": self.cluster_id, "node": self.node}

    def patch(self) -> dict[str, Any]:
        """Merge patch for the VirtualNode: the label set, or removed (null) to uncordon."""
        return {"spec": {"labels": {L.CORDONED: "true" if self.cordon else None}}}


@dataclass(frozen=True)
class Peering:
    """Peer with a new cluster (its kubeconfig uploaded), or unpeer from one, through ``liqoctl``."""

    cluster_id: str
    peer: bool
    kubeconfig: str
    """The remote cluster's kubeconfig (YAML text); needed to run liqoctl, not to show the command."""
    gpus: int = 0
    """GPUs the admin asks the provider for at peering (its first ResourceSlice); 0: Liqo's defaults only."""

    @property
    def kind(self) -> str:
        """``peer`` or ``unpeer``."""
        return "peer" if self.peer else "unpeer"

    def describe(self) -> str:
        """The action in words."""
        asked = f", asking for {self.gpus} GPU(s)" if self.gpus else ""
        return (f"{self.kind} cluster {self.cluster_id} with liqoctl (runs networking, authentication and "
                f"offloading{asked})")

    def form_fields(self) -> dict[str, str]:
        """The form fields that ask for this action again, without the kubeconfig (never sent back to a page)."""
        return {"cluster_id": self.cluster_id, **({"gpus": str(self.gpus)} if self.gpus else {})}


Action = SliceRequest | NodeLabels | Cordon | Peering


def _need(form: Mapping[str, Any], key: str) -> str:
    value = str(form.get(key) or "").strip()
    if not value:
        raise InvalidRequest(f"the field {key!r} is missing; fill it in and submit again")
    return value


FIELDS = {
    "resourceslice": ("cluster_id", "gpus", "name", "cpu", "memory"),
    "label": ("cluster_id", "node", "model", "price"),
    "cordon": ("cluster_id", "node"),
    "uncordon": ("cluster_id", "node"),
    "peer": ("cluster_id", "kubeconfig", "gpus"),
    "unpeer": ("cluster_id", "kubeconfig"),
}
"""The fields each action takes; any other is refused, so a misspelt optional field is not silently ignored."""


def parse_action(kind: str, form: Mapping[str, Any]) -> Action:
    """The validated action ``kind`` from form fields (strings) or a JSON body."""
    if kind not in FIELDS:
        raise InvalidRequest(f"unknown action {kind!r}; one of {', '.join(FIELDS)}")
    unknown = sorted(set(form) - set(FIELDS[kind]))
    if unknown:
        raise InvalidRequest(f"{_shown(unknown[0])} is not a field of {kind}; its fields are {', '.join(FIELDS[kind])}")
    cluster_id = dns_label(_need(form, "cluster_id"), "cluster_id")
    if kind == "resourceslice":
        name = str(form.get("name") or "").strip() or f"{cluster_id}-gpu"
        return SliceRequest(cluster_id, gpu_count(_need(form, "gpus")), dns_subdomain(name, "name"),
                            quantity(form.get("cpu"), "cpu"), quantity(form.get("memory"), "memory"))
    if kind == "label":
        return NodeLabels(cluster_id, dns_subdomain(_need(form, "node"), "node"),
                          label_value(_need(form, "model"), "model"), price(_need(form, "price")))
    if kind in ("cordon", "uncordon"):
        return Cordon(cluster_id, dns_subdomain(_need(form, "node"), "node"), kind == "cordon")
    kubeconfig = str(form.get("kubeconfig") or "")  # peer or unpeer: FIELDS has no other kind
    gpus = gpu_count(form["gpus"]) if str(form.get("gpus") or "").strip() else 0
    return Peering(cluster_id, kind == "peer", check_kubeconfig(kubeconfig) if kubeconfig.strip() else "", gpus)
