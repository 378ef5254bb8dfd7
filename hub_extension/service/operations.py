"""Carrying out a validated admin action against the API (the one I/O module of the actions), with audit.

Every outcome, success or failure, comes back in words and lands in the audit log; API errors are
translated by liqo_peering's error mapping, so the page never shows a stack trace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import urllib3
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import APIError, APINotFound, GpuOffloadError, InvalidRequest, api_error
from gpu_offload.liqo_peering.specs import gpu_resource_slice
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from ..accounting.store import Store
from ..config import HubConfig
from . import liqoctl
from .actions import Action, Cordon, NodeLabels, Peering, SliceRequest, tenant_namespace


@dataclass(frozen=True)
class ClusterFacts:
    """What the watches know that an action must respect (read from the state when the action is applied)."""

    consumer_cluster_id: str = ""
    """This cluster's Liqo id; empty when unknown."""
    authentication: Mapping[str, str] = field(default_factory=dict)
    """Per peered cluster id, the state of its authentication module: ``ok``, ``disabled`` or the bad conditions."""


@dataclass(frozen=True)
class ActionResult:
    """How an action ended, in words for the page and the audit log."""

    ok: bool
    message: str
    command: str = ""
    """For peering without liqoctl: the exact command the operator should run."""


def _tenant(config: HubConfig, cluster_id: str) -> str:
    namespace = tenant_namespace(cluster_id)
    if namespace not in config.tenant_namespaces:
        raise InvalidRequest(
            f"the hub may not write in {namespace} (cluster {cluster_id}): add it to the chart's "
            "liqo.tenantNamespaces and run helm upgrade, then retry"
        )
    return namespace


def _authenticated_peer(facts: ClusterFacts, cluster_id: str) -> None:
    # Liqo grants a ResourceSlice only over an established authentication; asking earlier just leaves a
    # slice that never gets resources, with nothing on the page saying why.
    state = facts.authentication.get(cluster_id)
    if state is None:
        raise InvalidRequest(f"cluster {cluster_id} is not peered (no ForeignCluster for it): peer with it first")
    if state != "ok":
        raise InvalidRequest(f"cluster {cluster_id} is not an authenticated peer (authentication: {state}); fix the "
                             "peering (liqoctl info) before asking it for GPUs")


class Operations:
    """Applies actions with the hub's own credentials."""

    def __init__(self, config: HubConfig, api_client: ApiClient, store: Store,
                 on_api_error: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.custom = CustomObjectsApi(api_client)
        self.store = store
        self._on_api_error = on_api_error
        """Told the Kubernetes verb of each request that failed (the service's metrics count them)."""

    def _failed(self, verb: str, error: APIError) -> APIError:
        # an answer the flow expects (a 404 before creating) is not a failure: callers count only what they raise
        if self._on_api_error is not None:
            self._on_api_error(verb)
        return error

    def apply(self, action: Action, who: str, facts: ClusterFacts) -> ActionResult:
        """Carry out ``action`` for ``who`` and audit it; errors become an unsuccessful ActionResult."""
        try:
            outcome = self._dispatch(action, facts)
        except (GpuOffloadError, ValueError) as exc:
            outcome = ActionResult(False, str(exc))
        self.store.audit(who, action.kind, _target(action), outcome.message, outcome.ok)
        return outcome

    def _dispatch(self, action: Action, facts: ClusterFacts) -> ActionResult:
        if isinstance(action, SliceRequest):
            return self._slice(action, facts)
        if isinstance(action, (NodeLabels, Cordon)):
            return self._patch_virtual_node(action)
        return self._peering(action)

    def _slice(self, action: SliceRequest, facts: ClusterFacts) -> ActionResult:
        namespace = _tenant(self.config, action.cluster_id)
        _authenticated_peer(facts, action.cluster_id)
        g = L.RESOURCE_SLICE
        where = f"ResourceSlice {namespace}/{action.name}"

        try:
            self.custom.get_namespaced_custom_object(g.group, g.version, namespace, g.plural, action.name)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, "writing", where)
            if not isinstance(error, APINotFound):
                raise self._failed("get", error) from exc
            if not facts.consumer_cluster_id:
                raise InvalidRequest(
                    f"cannot create {where}: this cluster's Liqo id is unknown; set liqo.clusterID in the "
                    "gpu-offload configuration"
                ) from None
            body = gpu_resource_slice(action.name, namespace, facts.consumer_cluster_id, action.cluster_id,
                                      action.gpus, action.cpu, action.memory)
            try:
                self.custom.create_namespaced_custom_object(g.group, g.version, namespace, g.plural, body)
            except (ApiException, urllib3.exceptions.HTTPError) as exc2:
                raise self._failed("create", api_error(exc2, "writing", where)) from exc2
            return ActionResult(True, f"created {where} asking cluster {action.cluster_id} for {action.gpus} GPU(s);"
                                " the provider grants it shortly")
        try:
            self.custom.patch_namespaced_custom_object(g.group, g.version, namespace, g.plural, action.name,
                                                       action.resize_patch())
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise self._failed("patch", api_error(exc, "writing", where)) from exc
        return ActionResult(True, f"resized {where} to {action.gpus} GPU(s); the virtual node follows once granted")

    def _patch_virtual_node(self, action: NodeLabels | Cordon) -> ActionResult:
        namespace = _tenant(self.config, action.cluster_id)
        g = L.VIRTUAL_NODE
        where = f"VirtualNode {namespace}/{action.node}"
        try:
            self.custom.patch_namespaced_custom_object(g.group, g.version, namespace, g.plural, action.node,
                                                       action.patch())
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, "patching", where)
            if isinstance(error, APINotFound):
                raise InvalidRequest(f"{where} does not exist: pick a virtual node listed on the cluster's page") from exc
            raise self._failed("patch", error) from exc
        if isinstance(action, Cordon):
            done = "cordoned: new runs avoid it" if action.cordon else "uncordoned: placement may choose it again"
            return ActionResult(True, f"virtual node {action.node} {done}")
        return ActionResult(True, f"virtual node {action.node} labelled GPU model {action.model}, {action.price} per GPU-hour "
                             "on its VirtualNode; labels already on the Node win until Liqo copies these over")

    def _peering(self, action: Peering) -> ActionResult:
        if not self.config.liqoctl_enabled:
            shown = liqoctl.shown_command(action)
            return ActionResult(False, f"{action.kind} is not run from the hub (peering.liqoctlEnabled is false): run "
                                  f"this with admin rights on both clusters: {shown}", command=shown)
        result = liqoctl.run(action)
        return ActionResult(result.ok, result.message)


def _target(action: Action) -> str:
    node = getattr(action, "node", None)
    return f"cluster {action.cluster_id}" + (f", virtual node {node}" if node else "") + (
        f", ResourceSlice {action.name}" if isinstance(action, SliceRequest) else "")
