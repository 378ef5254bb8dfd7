"""Seeds an origin cluster peered through Liqo with N GPU donors: pure builders of the objects Liqo creates.

Per donor (cluster id ``<id>``), as Liqo v1 would leave them after ``liqoctl peer`` and a GPU ResourceSlice:

- ``ForeignCluster/<id>`` with role Provider and every module (networking, authentication, offloading)
  enabled and healthy;
- the tenant namespace ``liqo-tenant-<id>`` holding ``ResourceSlice/<id>-gpu`` (granted: cpu, memory, pods
  and ``nvidia.com/gpu``) and ``VirtualNode/<id>-gpu``;
- ``Node/<id>-gpu``: taint ``virtual-node.liqo.io/not-allowed=true:NoExecute``, labels
  ``liqo.io/type=virtual-node`` and ``liqo.io/remote-cluster-id=<id>``, capacity = the granted slice.

Liqo does not carry GPU models or prices across (see docs/design.md), so the consumer labels the
VirtualNode, and the sandbox does the same with two keys of the project's own:

- label ``gpu-offload.io/gpu-model`` (e.g. ``A100``);
- label and annotation ``gpu-offload.io/price-per-gpu-hour`` (a decimal string, e.g. ``2.50``).

A donor may share its GPUs (``Donor.sharing``), as NVIDIA's device plugin or a memory isolator would on its
nodes; its slice then grants what that donor's nodes advertise, and the VirtualNode carries the labels its
labeller reports (``gpu-offload.io/gpu-sharing``, ``gpu-replicas``, ``gpu-memory``):

- ``time-slicing`` / ``mps``: ``nvidia.com/gpu.shared`` = GPUs x replicas (the plugin's ``renameByDefault``);
- ``mig``: one ``nvidia.com/mig-<profile>`` per profile of ``mig_profiles`` (``1g.10gb:3`` = three per GPU);
- ``memory`` (HAMi): ``nvidia.com/gpu`` = GPUs x 10 slots and ``nvidia.com/gpumem`` = the GPUs' MiB.

The origin's own nodes have no GPU: ``origin-core`` and ``origin-user`` (labelled
``hub.jupyter.org/node-purpose=user``, where KubeSpawner's user pods land). Neither is tainted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ORIGIN_CLUSTER_ID = "origin"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_MODEL_LABEL = "gpu-offload.io/gpu-model"
GPU_MEMORY_LABEL = "gpu-offload.io/gpu-memory"
SHARING_LABEL = "gpu-offload.io/gpu-sharing"
REPLICAS_LABEL = "gpu-offload.io/gpu-replicas"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MEMORY_RESOURCE = "nvidia.com/gpumem"
MEMORY_SLOTS = 10
"""HAMi's default ``deviceSplitCount``: how many pods may share one GPU under a memory isolator."""
PRICE_KEY = "gpu-offload.io/price-per-gpu-hour"
TYPE_LABEL = "liqo.io/type"
VIRTUAL_NODE_TYPE = "virtual-node"
REMOTE_CLUSTER_ID_LABEL = "liqo.io/remote-cluster-id"
RESOURCE_SLICE_NAME_LABEL = "liqo.io/resourceslice-name"  # on a VirtualNode: the slice it was made for
# What makes a ResourceSlice one the consumer's Liqo acts on and sends to its provider (the CRD replicator's
# LocalResourcesLabelSelector), and asks for a virtual node of it (liqoctl's forge.MutateResourceSlice)
REPLICATION_LABEL = "liqo.io/replication"
REPLICATION_DESTINATION_LABEL = "liqo.io/remoteID"
CREATE_VIRTUAL_NODE = "liqo.io/create-virtual-node"
VIRTUAL_NODE_TAINT: dict[str, str] = {"key": "virtual-node.liqo.io/not-allowed", "value": "true",
                                      "effect": "NoExecute"}
USER_NODE = "origin-user"
CORE_NODE = "origin-core"
LIQO_NAMESPACE = "liqo"
# Fixed so a report or a screenshot of a sandbox never looks like a real cluster's timestamps.
SEED_TIME = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class Donor:
    """One peered cluster that lends GPUs to the origin."""

    cluster_id: str
    gpus: int
    gpu_model: str
    """The model its virtual node is labelled with; empty: a donor whose nodes carry no model label."""
    price_per_gpu_hour: str
    """Decimal string; becomes a label value, so digits and one dot only."""
    cpu: str = "32"
    memory: str = "128Gi"
    pods: str = "110"
    ephemeral_storage: str = "200Gi"
    """Liqo slices carry it too; Metaflow's `@kubernetes` asks for 10240M of it by default."""
    sharing: str = "none"
    """How the donor shares its GPUs: none, time-slicing, mps, mig or memory."""
    replicas: int = 1
    """Shares per GPU under time-slicing or MPS."""
    renamed: bool = True
    """Under time-slicing or MPS, the shares are ``nvidia.com/gpu.shared`` (the plugin's ``renameByDefault``);
    False: they keep the name ``nvidia.com/gpu`` (the plugin without ``renameByDefault``)."""
    gpu_memory_gib: int = 80
    mig_profiles: str = "1g.10gb:3,3g.40gb:1"
    """Under ``mig``: ``profile:count`` per GPU."""

    def gpu_resources(self) -> dict[str, str]:
        """What the donor's nodes advertise for its GPUs in its sharing mode."""
        if self.sharing in ("time-slicing", "mps"):
            return {SHARED_RESOURCE if self.renamed else GPU_RESOURCE: str(self.gpus * self.replicas)}
        if self.sharing == "mig":
            pairs = (item.split(":") for item in self.mig_profiles.split(",") if item)
            return {f"nvidia.com/mig-{name}": str(int(count) * self.gpus) for name, count in pairs}
        if self.sharing == "memory":
            return {GPU_RESOURCE: str(self.gpus * MEMORY_SLOTS), MEMORY_RESOURCE: str(self.gpus * self.gpu_memory_gib * 1024)}
        return {GPU_RESOURCE: str(self.gpus)}

    @property
    def tenant_namespace(self) -> str:
        return f"liqo-tenant-{self.cluster_id}"

    @property
    def node_name(self) -> str:
        return f"{self.cluster_id}-gpu"

    def granted(self) -> dict[str, str]:
        """The resources the donor granted in its ResourceSlice."""
        return {"cpu": self.cpu, "memory": self.memory, "pods": self.pods,
                "ephemeral-storage": self.ephemeral_storage, **self.gpu_resources()}


def donors(count: int, gpus: int = 4, gpu_model: str = "A100",
           prices: tuple[str, ...] = ()) -> tuple[Donor, ...]:
    """``count`` donors ``donor-1``..``donor-N``; without ``prices`` each costs 0.25 more than the last."""
    if count < 0 or gpus < 0:
        raise ValueError(f"donors: count ({count}) and gpus ({gpus}) must be >= 0")
    if prices and len(prices) != count:
        raise ValueError(f"donors: {len(prices)} prices for {count} donors; give one per donor or none")
    return tuple(
        Donor(f"donor-{i + 1}", gpus, gpu_model, prices[i] if prices else f"{2.0 + 0.25 * i:.2f}")
        for i in range(count)
    )


def _meta(name: str, namespace: str | None = None, labels: Mapping[str, str] | None = None,
          annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    cond = {"type": type_, "status": status, "lastTransitionTime": SEED_TIME}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def namespace(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A v1 Namespace."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, labels=labels)}


def foreign_cluster(donor: Donor) -> dict[str, Any]:
    """The ForeignCluster of a donor whose peering is complete and healthy."""
    modules = {
        "networking": [_condition("NetworkConfigurationStatus", "Ready"),
                       _condition("NetworkGatewayClientStatus", "Ready"),
                       _condition("NetworkConnectionStatus", "Established")],
        "authentication": [_condition("AuthIdentityControlPlaneStatus", "Established")],
        "offloading": [_condition("OffloadingVirtualNodeStatus", "Ready"),
                       _condition("OffloadingNodeStatus", "Ready")],
    }
    return {
        "apiVersion": "core.liqo.io/v1beta1", "kind": "ForeignCluster",
        "metadata": _meta(donor.cluster_id, labels={"discovery.liqo.io/cluster-id": donor.cluster_id}),
        "spec": {"clusterID": donor.cluster_id},
        "status": {
            "role": "Provider",
            "apiServerUrl": f"https://{donor.cluster_id}.sandbox.invalid:6443",
            "conditions": [_condition("APIServerStatus", "Established")],
            "modules": {name: {"enabled": True, "conditions": conds} for name, conds in modules.items()},
            "tenantNamespace": {"local": donor.tenant_namespace,
                                "remote": f"liqo-tenant-{ORIGIN_CLUSTER_ID}"},
        },
    }


def slice_labels(provider: str) -> dict[str, str]:
    """The labels liqoctl gives a ResourceSlice asking ``provider`` for resources."""
    return {REMOTE_CLUSTER_ID_LABEL: provider, REPLICATION_LABEL: "true", REPLICATION_DESTINATION_LABEL: provider}


def resource_slice(donor: Donor) -> dict[str, Any]:
    """The donor's GPU ResourceSlice, requested by the origin and granted in full."""
    return {
        "apiVersion": "authentication.liqo.io/v1beta1", "kind": "ResourceSlice",
        "metadata": _meta(donor.node_name, donor.tenant_namespace, slice_labels(donor.cluster_id),
                          {CREATE_VIRTUAL_NODE: "true"}),
        "spec": {"class": "default", "consumerClusterID": ORIGIN_CLUSTER_ID,
                 "providerClusterID": donor.cluster_id, "resources": donor.granted()},
        "status": {
            "conditions": [_condition("Authentication", "Accepted"), _condition("Resources", "Accepted")],
            "resources": donor.granted(),
        },
    }


def _virtual_node_labels(donor: Donor) -> dict[str, str]:
    labels = {PRICE_KEY: donor.price_per_gpu_hour, **({GPU_MODEL_LABEL: donor.gpu_model} if donor.gpu_model else {})}
    if donor.sharing != "none":  # what the donor's labeller reports, carried to the VirtualNode
        labels.update({SHARING_LABEL: donor.sharing, REPLICAS_LABEL: str(donor.replicas),
                       GPU_MEMORY_LABEL: f"{donor.gpu_memory_gib}Gi"})
    return labels


def virtual_node(donor: Donor) -> dict[str, Any]:
    """The VirtualNode the origin's Liqo keeps for the donor's GPU slice, labelled with model and price."""
    return {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "VirtualNode",
        "metadata": _meta(donor.node_name, donor.tenant_namespace,
                          {REMOTE_CLUSTER_ID_LABEL: donor.cluster_id, RESOURCE_SLICE_NAME_LABEL: donor.node_name}),
        "spec": {
            "clusterID": donor.cluster_id, "createNode": True,
            "labels": _virtual_node_labels(donor),
            "annotations": {PRICE_KEY: donor.price_per_gpu_hour},
            "taints": [dict(VIRTUAL_NODE_TAINT)],
            "resourceQuota": {"hard": donor.granted()},
        },
        "status": {"conditions": [_condition("VirtualKubelet", "Running"), _condition("Node", "Running")]},
    }


def node(name: str, ip: str, capacity: Mapping[str, str], labels: Mapping[str, str],
         taints: list[dict[str, str]] | None = None, annotations: Mapping[str, str] | None = None,
         kubelet_version: str = "v1.33.0") -> dict[str, Any]:
    """A Ready v1 Node whose allocatable equals its capacity."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", **labels}
    spec: dict[str, Any] = {"taints": [dict(t) for t in taints]} if taints else {}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": _meta(name, labels=all_labels, annotations=annotations),
        "spec": spec,
        "status": {
            "capacity": dict(capacity), "allocatable": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status (sandbox)",
                            "lastHeartbeatTime": SEED_TIME, "lastTransitionTime": SEED_TIME}],
            "nodeInfo": {"machineID": name, "systemUUID": name, "bootID": name,
                         "kernelVersion": "sandbox", "osImage": "gpu-offload sandbox (not a cluster)",
                         "containerRuntimeVersion": "sandbox://local-processes",
                         "kubeletVersion": kubelet_version, "kubeProxyVersion": kubelet_version,
                         "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


def virtual_node_node(donor: Donor, index: int) -> dict[str, Any]:
    """The Node that Liqo's virtual kubelet registers for the donor's VirtualNode."""
    labels = {TYPE_LABEL: VIRTUAL_NODE_TYPE, REMOTE_CLUSTER_ID_LABEL: donor.cluster_id,
              "kubernetes.io/role": "agent", "type": "virtual-kubelet", **_virtual_node_labels(donor)}
    return node(donor.node_name, f"127.0.2.{index + 1}", donor.granted(), labels,
                taints=[dict(VIRTUAL_NODE_TAINT)], annotations={PRICE_KEY: donor.price_per_gpu_hour},
                kubelet_version="v1.33.0-liqo-sandbox")


def local_nodes() -> list[dict[str, Any]]:
    """The origin's own GPU-less nodes; KubeSpawner's user pods land on ``origin-user``."""
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return [
        node(CORE_NODE, "127.0.1.1", capacity, {"hub.jupyter.org/node-purpose": "core"}),
        node(USER_NODE, "127.0.1.2", capacity, {"hub.jupyter.org/node-purpose": "user"}),
    ]


def donor_objects(donor: Donor, index: int) -> list[dict[str, Any]]:
    """Everything one donor adds to the origin, in creation order."""
    tenant = namespace(donor.tenant_namespace, {"liqo.io/tenant-namespace": "true",
                                                REMOTE_CLUSTER_ID_LABEL: donor.cluster_id})
    return [tenant, foreign_cluster(donor), resource_slice(donor), virtual_node(donor),
            virtual_node_node(donor, index)]


def topology(donor_list: tuple[Donor, ...]) -> list[dict[str, Any]]:
    """The whole seeded origin in creation order: Liqo's namespace, local nodes, then each donor."""
    objects: list[dict[str, Any]] = [namespace(LIQO_NAMESPACE), *local_nodes()]
    for index, donor in enumerate(donor_list):
        objects += donor_objects(donor, index)
    return objects


def capacity_from_slice(resource_slice_obj: Mapping[str, Any]) -> dict[str, str] | None:
    """What a virtual node may offer for this ResourceSlice: the granted resources, or None if not granted."""
    status = resource_slice_obj.get("status") or {}
    accepted = any(c.get("type") == "Resources" and c.get("status") == "Accepted"
                   for c in status.get("conditions") or [])
    if not accepted:
        return None
    return {k: str(v) for k, v in (status.get("resources") or {}).items()}


def is_virtual_node(node_obj: Mapping[str, Any]) -> bool:
    """Whether a Node is a Liqo virtual node."""
    labels = (node_obj.get("metadata") or {}).get("labels") or {}
    return labels.get(TYPE_LABEL) == VIRTUAL_NODE_TYPE
