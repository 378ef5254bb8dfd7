"""What the sandbox serves: one :class:`ResourceType` per (group, version, plural), built-in or from a CRD.

Extension point (part 2): ``ResourceRegistry.add_crd(manifest)`` registers a CustomResourceDefinition
manifest (a dict, as in a CRD YAML); ``load_crd_dir(path)`` reads every ``*.yaml`` in a folder. Custom
resources are then served, listed in discovery and validated against the CRD's ``openAPIV3Schema``.
Objects of all versions of one CRD share one storage key ``(group, plural)``, as in a real server.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One served resource in one API version."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # openAPIV3Schema of a custom resource; None for built-in kinds (those use kubernetes-validate)
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    # additionalPrinterColumns of a CRD version, for kubectl's table output
    printer_columns: tuple[Mapping[str, Any], ...] = field(default=(), compare=False, hash=False)

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key shared by all versions of a resource."""
        return (self.group, self.plural)

    @property
    def custom(self) -> bool:
        """True for resources defined by a CRD."""
        return self.schema is not None

    def describe(self) -> str:
        """``pods`` or ``virtualnodes.offloading.liqo.io``, as error messages name resources."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _core(plural: str, kind: str, namespaced: bool = True, short: tuple[str, ...] = (),
          sub: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, kind.lower(), short, sub, ("all",) if
                        plural in ("pods", "services") else ())


BUILTINS: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", namespaced=False, short=("ns",), sub=("status",)),
    _core("pods", "Pod", short=("po",), sub=("status", "log", "attach", "exec", "portforward")),
    _core("secrets", "Secret"),
    _core("configmaps", "ConfigMap", short=("cm",)),
    _core("services", "Service", short=("svc",), sub=("status",)),
    _core("endpoints", "Endpoints", short=("ep",)),
    _core("nodes", "Node", namespaced=False, short=("no",), sub=("status",)),
    _core("events", "Event", short=("ev",)),
    _core("serviceaccounts", "ServiceAccount", short=("sa",)),
    # the hub's spawner hook caps each user's GPUs with one; pod creation enforces it (quota.py)
    _core("resourcequotas", "ResourceQuota", short=("quota",), sub=("status",)),
    # KubeSpawner creates one per user when storage is configured; no provisioner binds it here
    _core("persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), sub=("status",)),
    ResourceType("events.k8s.io", "v1", "events", "Event", True, "event", ("ev",)),
    ResourceType("batch", "v1", "jobs", "Job", True, "job", (), ("status",), ("all",)),
    # what an Eviction (pods/eviction, eviction.py) asks; the disruption controller writes its status
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, "poddisruptionbudget",
                 ("pdb",), ("status",)),
    # written by the kubelet's EndpointSlice controller (endpointslices.py)
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, "endpointslice", ()),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 False, "customresourcedefinition", ("crd", "crds"), ("status",)),
)


def crd_resource_types(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The served versions of a CRD manifest; raises ValueError naming the CRD if it is malformed."""
    name = crd.get("metadata", {}).get("name", "<unnamed>")
    try:
        spec = crd["spec"]
        names = spec["names"]
        out = []
        for ver in spec["versions"]:
            if not ver.get("served", True):
                continue
            schema = (ver.get("schema") or {}).get("openAPIV3Schema")
            if schema is None:
                raise ValueError("a served version has no schema.openAPIV3Schema")
            out.append(ResourceType(
                spec["group"], ver["name"], names["plural"], names["kind"],
                spec.get("scope", "Namespaced") == "Namespaced", names.get("singular", names["kind"].lower()),
                tuple(names.get("shortNames", ())), tuple(sorted(ver.get("subresources", {}))),
                tuple(names.get("categories", ())), schema, tuple(ver.get("additionalPrinterColumns", ())),
            ))
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"CustomResourceDefinition {name!r} is malformed (missing {exc}); "
            "pass a manifest as generated by controller-gen (apiextensions.k8s.io/v1)"
        ) from exc
    return out


class ResourceRegistry:
    """All served resource types; thread-safe, since CRDs can be added while the server runs."""

    def __init__(self, types: Iterable[ResourceType] = BUILTINS) -> None:
        self._lock = threading.Lock()
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._by_gvk: dict[tuple[str, str], ResourceType] = {}
        for rt in types:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        """Serve ``rt`` (replacing an earlier definition of the same group/version/plural)."""
        with self._lock:
            self._by_gvr[(rt.group, rt.version, rt.plural)] = rt
            self._by_gvk[(rt.api_version, rt.kind)] = rt

    def add_crd(self, crd: Mapping[str, Any]) -> list[ResourceType]:
        """Serve every served version of a CRD manifest; returns the new resource types."""
        types = crd_resource_types(crd)
        for rt in types:
            self.add(rt)
        return types

    def remove_crd(self, crd: Mapping[str, Any]) -> list[ResourceType]:
        """Stop serving every version of a deleted CRD; returns the types no longer served."""
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        with self._lock:
            gone = [rt for rt in self._by_gvr.values() if (rt.group, rt.plural) == (group, plural)]
            for rt in gone:
                del self._by_gvr[(rt.group, rt.version, rt.plural)]
                self._by_gvk.pop((rt.api_version, rt.kind), None)
        return gone

    def load_crd_dir(self, directory: Path) -> list[ResourceType]:
        """Load every CustomResourceDefinition in ``directory/*.yaml`` (other documents are ignored)."""
        if not directory.is_dir():
            raise FileNotFoundError(
                f"CRD directory {directory} does not exist; pass a folder of CRD YAML manifests"
            )
        loaded: list[ResourceType] = []
        for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
            # libyaml when present: Liqo's VirtualNode CRD takes seconds with the pure-Python loader
            for doc in yaml.load_all(path.read_text(), Loader=_YAML_LOADER):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    try:
                        loaded += self.add_crd(doc)
                    except ValueError as exc:
                        raise ValueError(f"{path}: {exc}") from exc
        return loaded

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The type served at ``/apis/group/version/plural`` (group "" for the core API)."""
        with self._lock:
            return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        """The type of an object with this apiVersion and kind."""
        with self._lock:
            return self._by_gvk.get((api_version, kind))

    def all(self) -> list[ResourceType]:
        """Every served type, in a stable order."""
        with self._lock:
            return sorted(self._by_gvr.values(), key=lambda r: (r.group, r.version, r.plural))

    def groups(self) -> dict[str, list[str]]:
        """Group name -> served versions, newest first as Kubernetes sorts them (v1 before v1beta1)."""
        out: dict[str, list[str]] = {}
        for rt in self.all():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        for versions in out.values():
            versions.sort(key=_version_priority)
        return out


def _version_priority(version: str) -> tuple[int, int, int]:
    # Kubernetes orders GA > beta > alpha, then by major and minor number descending.
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0)
    stage = {"alpha": 2, "beta": 1, None: 0}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0))
