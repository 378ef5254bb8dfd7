"""Names the project shares with Liqo and with itself: label keys, taints, API groups.

The Liqo names are facts of Liqo v1.x (read from its source and CRDs); the ``gpu-offload.io/`` names are the
project's own interface: the sandbox seeds donors with the same keys, admins set them with kubectl, so a
rename here is a breaking change.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- Kubernetes' node controller ---------------------------------------------------------------------------
NODE_NOT_READY_TAINT = "node.kubernetes.io/not-ready"
NODE_UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
"""NoExecute taints Kubernetes' node controller puts on a node whose Ready condition is False or Unknown."""
DISRUPTION_TARGET = "DisruptionTarget"
"""The pod condition Kubernetes sets before it deletes a pod for a disruption (reason ``DeletionByTaintManager``:
its node's NoExecute taint outlasted the pod's toleration)."""
TAINT_EVICTION = "DeletionByTaintManager"
EVICTION_API = "EvictionByEvictionAPI"
"""The reason of that condition when the pod was evicted through the Eviction API (``kubectl drain``, a descheduler):
its PodDisruptionBudgets allowed it, and it is deleted with its grace period."""

# --- Liqo ---------------------------------------------------------------------------------------------
VIRTUAL_NODE_TAINT_KEY = "virtual-node.liqo.io/not-allowed"
"""Taint (value ``true``, effect NoExecute) on every Liqo virtual node."""
VIRTUAL_NODE_TAINT_EFFECT = "NoExecute"
TYPE_LABEL = "liqo.io/type"
"""Node label whose value is ``virtual-node`` on Liqo virtual nodes."""
TYPE_VIRTUAL_NODE = "virtual-node"
REMOTE_CLUSTER_ID_LABEL = "liqo.io/remote-cluster-id"
"""Node label naming the cluster a virtual node leads to."""
# A ResourceSlice the consumer writes (liqoctl's forge.MutateResourceSlice, Liqo v1.2): Liqo's controllers on the
# consumer act only on slices labelled for replication to a peer (LocalResourcesLabelSelector: no CSR, never
# sent to the provider, never granted otherwise), and its virtualnodecreator makes a VirtualNode only for a
# granted slice with CREATE_VIRTUAL_NODE set (anything but "" or "false") and REMOTE_CLUSTER_ID_LABEL.
REPLICATION_LABEL = "liqo.io/replication"
"""``"true"`` on an object Liqo's CRD replicator copies to the peer named by :data:`REPLICATION_DESTINATION_LABEL`."""
REPLICATION_DESTINATION_LABEL = "liqo.io/remoteID"
CREATE_VIRTUAL_NODE = "liqo.io/create-virtual-node"
"""Annotation on a ResourceSlice asking Liqo to make a virtual node of it once granted."""
NAMESPACE_OFFLOADING_NAME = "offloading"
"""Liqo only honours a NamespaceOffloading with exactly this name."""
# Liqo's reflection of Secrets and ConfigMaps (pkg/consts/replication.go, and ShouldSkipReflection in
# pkg/virtualKubelet/reflection/generic/namespaced.go): under the default DenyList every object of an offloaded
# namespace is copied to every donor it is offloaded to unless SKIP_REFLECTION is set (to anything but "false");
# under AllowList only objects with ALLOW_REFLECTION (anything but "false") are.
SKIP_REFLECTION = "liqo.io/skip-reflection"
ALLOW_REFLECTION = "liqo.io/allow-reflection"
LIQO_RUNTIME_CLASS = "liqo"
"""The RuntimeClass Liqo creates: a pod naming it goes to virtual nodes whatever the offloading strategy."""
GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource name of NVIDIA GPUs (device plugin), also the key in ResourceSlice resources."""


@dataclass(frozen=True)
class GVK:
    """Group, version and plural of a custom resource, as CustomObjectsApi wants them."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        """``group/version`` as written in an object's ``apiVersion``."""
        return f"{self.group}/{self.version}"


FOREIGN_CLUSTER = GVK("core.liqo.io", "v1beta1", "foreignclusters", "ForeignCluster")
VIRTUAL_NODE = GVK("offloading.liqo.io", "v1beta1", "virtualnodes", "VirtualNode")
NAMESPACE_OFFLOADING = GVK("offloading.liqo.io", "v1beta1", "namespaceoffloadings", "NamespaceOffloading")
RESOURCE_SLICE = GVK("authentication.liqo.io", "v1beta1", "resourceslices", "ResourceSlice")

# --- Kueue (v1beta2, the storage version of Kueue 0.15 and later) ---------------------------------------
KUEUE_GROUP = "kueue.x-k8s.io"
RESOURCE_FLAVOR = GVK(KUEUE_GROUP, "v1beta2", "resourceflavors", "ResourceFlavor")
CLUSTER_QUEUE = GVK(KUEUE_GROUP, "v1beta2", "clusterqueues", "ClusterQueue")
LOCAL_QUEUE = GVK(KUEUE_GROUP, "v1beta2", "localqueues", "LocalQueue")
WORKLOAD_PRIORITY_CLASS = GVK(KUEUE_GROUP, "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass")
WORKLOAD = GVK(KUEUE_GROUP, "v1beta2", "workloads", "Workload")
QUEUE_NAME_LABEL = KUEUE_GROUP + "/queue-name"
"""Label naming the LocalQueue a pod or Job waits in; Kueue's webhook gates only pods carrying it."""
PRIORITY_CLASS_LABEL = KUEUE_GROUP + "/priority-class"
"""Label naming the WorkloadPriorityClass of a pod or Job."""
ADMISSION_GATE = KUEUE_GROUP + "/admission"
"""The scheduling gate Kueue's webhook puts on a queued pod and removes when it admits it."""
VISIBILITY_GROUP = "visibility." + KUEUE_GROUP
VISIBILITY_VERSION = "v1beta2"
"""Kueue's visibility API (pending workloads of a queue), served by Kueue through API aggregation."""

# --- the project's own keys ---------------------------------------------------------------------------
PREFIX = "gpu-offload.io/"
GPU_MODEL = PREFIX + "gpu-model"
"""Label on a virtual node (or its VirtualNode) naming the GPU model, e.g. ``A100``: Liqo does not reflect it."""
GPU_MEMORY = PREFIX + "gpu-memory"
"""Label with the memory of one GPU, e.g. ``80Gi``."""
GPU_SHARING = PREFIX + "gpu-sharing"
"""Label with how the donor shares its GPUs: ``none``, ``time-slicing``, ``mps``, ``mig`` or ``memory``
(``sharing.SHARING_MODES``); set by the donor's labeller, carried to the VirtualNode like the model."""
GPU_REPLICAS = PREFIX + "gpu-replicas"
"""Label with the shares each GPU is offered as under time-slicing or MPS, e.g. ``4``."""
PRICE_PER_GPU_HOUR = PREFIX + "price-per-gpu-hour"
"""Label or annotation with the admin's price of one GPU-hour, a decimal number, e.g. ``2.5``."""
USER_NAMESPACE = PREFIX + "user-namespace"
"""Label ``true`` on the namespaces the hub made for users: the chart's admission policy and the ClusterQueue's
namespaceSelector select on it."""
CORDONED = PREFIX + "cordoned"
"""Label or annotation ``true`` on a virtual node the admin has taken out of placement."""
USER = PREFIX + "user"
KERNEL = PREFIX + "kernel"
RUN_ID = PREFIX + "run-id"
SERVER = PREFIX + "server"
"""The Jupyter server whose kernel made a runner pod: that server deletes the pods of kernels it no longer has."""
METERED_FINALIZER = PREFIX + "metered"
"""Finalizer on runner pods in a hub deployment: the hub's meter removes it once it recorded the pod's GPU time,
so a pod created and deleted while the hub was down is still metered when it comes back."""
KERNEL_PID = PREFIX + "kernel-pid"
"""The kernel's process id beside ``SERVER``: a kernel restarted after a crash keeps its id but not its pid."""
ORIGIN = PREFIX + "origin"
"""``cli`` on runner pods of ``gpu-offload run``: no kernel owns them, so the orphan sweep leaves them alone
(``--timeout``, ``gpu-offload cancel`` and ``gpu-offload cleanup`` end them)."""
ORIGIN_CLI = "cli"
MANAGED_BY = PREFIX + "managed-by"
MANAGED_BY_VALUE = "gpu-offload"
"""Value of ``gpu-offload.io/managed-by`` on everything the project creates (label-based cleanup uses it)."""
