"""Pure builders of what the spawner hook creates in a user's namespace, and the user server's environment.

Names and roles come from the chart (through ``HubConfig``): the hub binds two ClusterRoles the chart
made, inside the namespace only, so the hub never holds these rights cluster-wide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_offload.liqo_peering import environment as E
from gpu_offload.liqo_peering import kueue
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.liqo_peering.specs import NO_CLUSTER, NOT_REFLECTED, namespace_offloading

from ..config import POD_SECURITY_LABEL, USER_NAMESPACE_LABEL, HubConfig
from ..service.actions import dns_label

HUB_BINDING = "gpu-offload-hub"
USER_SERVER_BINDING = "gpu-offload-user-server"


def check_namespace(name: str, config: HubConfig) -> str:
    """``name`` if the chart's admission policy will admit it as a user namespace."""
    dns_label(name, "user namespace")
    prefix = config.user_namespace_prefix
    if not name.startswith(prefix):
        raise InvalidRequest(
            f"user namespace {name!r} does not start with {prefix!r}, so the chart's admission policy refuses it;"
            f" set c.KubeSpawner.user_namespace_template to \"{prefix}{{username}}\" (or the chart's "
            "userNamespaces.prefix to match)"
        )
    return name


def namespace(name: str, extra_labels: Mapping[str, str] | None = None, user: str = "",
              pod_security: str = "baseline") -> dict[str, Any]:
    """The user namespace, labelled so the admission policy admits it and cleanup can find it, with its Pod
    Security level, and annotated with its user (the raw name: the meter bills runs in it to that user)."""
    labels = {**(extra_labels or {}), USER_NAMESPACE_LABEL: "true", L.MANAGED_BY: L.MANAGED_BY_VALUE,
              POD_SECURITY_LABEL: pod_security}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if user:
        meta["annotations"] = {L.USER: user}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def _binding(name: str, namespace: str, cluster_role: str, account: str, account_namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}],
    }


def role_bindings(name: str, config: HubConfig) -> list[dict[str, Any]]:
    """The hub's binding (first: the rest of the hook needs it) and the users' server binding."""
    user_ns = config.user_namespaces
    return [
        _binding(HUB_BINDING, name, user_ns.hub_cluster_role, config.hub_service_account, config.hub_namespace),
        _binding(USER_SERVER_BINDING, name, user_ns.user_server_cluster_role,
                 user_ns.user_server_service_account, name),
    ]


def service_account(name: str, config: HubConfig) -> dict[str, Any]:
    """The account the user's server runs as (it may create pods and secrets in this namespace only)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": config.user_namespaces.user_server_service_account, "namespace": name,
                     "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE}},
    }


def offloading(name: str, config: HubConfig) -> dict[str, Any]:
    """The namespace's NamespaceOffloading: every peered cluster, or with the chart's ``offload.trustedOnly``
    the trusted ones only (no remote cluster at all while none is trusted).

    Pods stay local unless the project placed them (``podOffloadingStrategy: Local``), and a donor's virtual
    kubelet runs no pod of a namespace not offloaded to it, so a pod aimed at another cluster never runs there;
    users' servers may only read it: that is what makes trusted-only a policy rather than the kernel's default."""
    if not config.trusted_only:
        return namespace_offloading(name)
    trusted = config.clusters.trusted_ids
    return namespace_offloading(name, trusted) if trusted else namespace_offloading(name, NO_CLUSTER)


QUOTA_NAME = "gpu-offload"
OBJECT_QUOTA_NAME = "gpu-offload-objects"


def object_quota(name: str, config: HubConfig) -> dict[str, Any] | None:
    """The ResourceQuota capping how many pods (running ones), Secrets and Services the namespace holds, or
    None when every count is 0. Kept apart from the GPU quota, which Kueue replaces when queueing is on; these
    counts stay, since a gated pod is an object like any other."""
    hard = {kind: str(count) for kind, count in config.user_namespaces.object_quota if count}
    if not hard:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": OBJECT_QUOTA_NAME, "namespace": name, "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE}},
        "spec": {"hard": hard},
    }


def gpu_quota(name: str, config: HubConfig) -> dict[str, Any] | None:
    """The ResourceQuota capping the GPUs a user's pods hold at once, or None when the admin set no limit or
    runs queue through Kueue.

    Extended resources are quota'd by their request only (``requests.nvidia.com/gpu``); the API server
    defaults a GPU request to the limit the runner pods set.
    """
    # Under Kueue the per-user share is Kueue's. A ResourceQuota would defeat it: a pod counts against the
    # quota when it is created, gated or not, so a user's queued pods would be refused (403) instead of
    # waiting in the queue.
    if not config.gpu_quota_per_user or config.queueing is not None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA_NAME, "namespace": name, "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE}},
        "spec": {"hard": {f"requests.{L.GPU_RESOURCE}": str(config.gpu_quota_per_user)}},
    }


def local_queue(name: str, config: HubConfig) -> dict[str, Any] | None:
    """The Kueue LocalQueue of the user's namespace, or None when queueing is off."""
    return None if config.queueing is None else kueue.local_queue(name, config.queueing)


PRIORITY_CLASSES_NAME = "gpu-offload-priority-classes"
"""The ConfigMap in each user namespace naming the priority classes its user may use: the chart's admission
policy reads it as its parameter (same name in the chart's ``_user-namespace-policies.tpl``)."""


def priority_classes(name: str, config: HubConfig, user: str, groups: list[str] | tuple[str, ...] = ()
                     ) -> dict[str, Any] | None:
    """The ConfigMap of the classes ``user`` (in ``groups``) may use, one key each; None without queueing.

    Written by the hub at every spawn (group membership may have changed); users' servers cannot write it."""
    if config.queueing is None:
        return None
    allowed = config.queueing.allowed(user, groups)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": PRIORITY_CLASSES_NAME, "namespace": name,
                         "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE},
                         # the hub's policy data, not a donor's business (Liqo copies the namespace's ConfigMaps)
                         "annotations": dict(NOT_REFLECTED)},
            "data": {c: "allowed" for c in allowed}}


METAFLOW_NAMESPACE = "METAFLOW_KUBERNETES_NAMESPACE"
"""Metaflow's own setting (not the project's): the namespace ``@kubernetes`` steps' Jobs go to."""
METAFLOW_USER = "METAFLOW_USER"
"""Metaflow's own setting: the user its runs are recorded under; without it, or ``USERNAME``/``USER``, which a
user's server container does not have, Metaflow refuses to run ("Unknown user")."""


def server_environment(name: str, config: HubConfig, service_url: str = "", user: str = "") -> dict[str, str]:
    """What the magic in the user's server reads: backend, namespace, the service, image, object storage, and
    the queue and default priority when runs queue through Kueue; and what a flow run there needs
    (``flow_environment``)."""
    return {**flow_environment(name, user), **_magic_environment(name, config, service_url)}


def flow_environment(name: str, user: str = "") -> dict[str, str]:
    """What Metaflow in the user's server needs for ``python flow.py run`` to work there as the magic does.

    Step Jobs go to the user's namespace: the only one the server's account may create Jobs in, and an
    offloaded one. Runs are recorded under the hub user's name (left out when unknown). Placement comes from
    configuration (the queue, the trusted clusters and the namespace the spawner sets): the chart's user-server
    role reads no nodes or VirtualNodes, so ``auto`` would ask the cluster from the pod's in-cluster account
    and be refused."""
    env = {METAFLOW_NAMESPACE: name, **E.assignments({E.FLOW_SOURCE: "config"})}
    if user:
        env[METAFLOW_USER] = user
    return env


def _magic_environment(name: str, config: HubConfig, service_url: str) -> dict[str, str]:
    queueing = config.queueing
    return E.assignments({
        E.BACKEND: "kubernetes",
        E.NAMESPACE: name,
        E.IMAGE: config.default_image,
        E.PLACEMENT_POLICY: config.placement_policy,
        E.METERED: True,  # this hub's meter removes the finalizer runner pods then carry
        E.SERVICE_URL: service_url,  # those below are left out when empty
        E.S3_ENDPOINT: config.object_storage_endpoint,
        E.S3_BUCKET: config.object_storage_bucket,
        # the chart's trust reaches a server reading the cluster directly too
        E.TRUSTED_CLUSTERS: ",".join(config.clusters.trusted_ids),
        E.QUEUE: queueing.local_queue if queueing else None,
        E.PRIORITY: queueing.default_priority if queueing else None,
        E.TRUSTED_ONLY: config.trusted_only or None,  # unset when off: the kernel's default is off
        E.MONTHLY_BUDGET: None if config.monthly_budget_per_user is None else f"{config.monthly_budget_per_user:g}",
        E.SESSION_IDLE_TIMEOUT: config.session_idle_timeout or None,  # unset when off, as above
        E.SESSION_NOTICE: config.session_notice,
        # a protected session starts at the class the hub made for it and is lowered after the protection
        E.SESSION_PROTECTION: queueing.session_protection or None if queueing else None,
        E.PROTECTED_PRIORITY: queueing.protected_priority if queueing and queueing.session_protection else None,
    })
