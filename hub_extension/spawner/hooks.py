"""kubespawner integration: ``pre_spawn_hook`` prepares the user's offloaded namespace, ``profile_list``
offers "remote GPU via Liqo" profiles from the live inventory.

Wire them in the hub's configuration (the z2jh overlay does)::

    c.KubeSpawner.pre_spawn_hook = pre_spawn_hook
    c.KubeSpawner.profile_list = profile_list

The hook talks to the API through the spawner's own kubernetes_asyncio client, so it uses exactly the
credentials and API server kubespawner uses. Every step is idempotent (409 means done), so a retried
spawn repairs a half-prepared namespace instead of failing on it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from gpu_offload.liqo_peering import environment as E
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.cache import InventoryCache
from gpu_offload.liqo_peering.client import LiqoClient, api_client_from_environment
from gpu_offload.liqo_peering.errors import APIConflict, APIForbidden, APINotFound, GpuOffloadError, api_error
from gpu_offload.liqo_peering.inventory import Inventory
from gpu_offload.liqo_peering.retrying import Backoff, retry_async
from gpu_offload.liqo_peering.settings import read_kernel
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi, NetworkingV1Api, RbacAuthorizationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from ..config import HubConfig, load_config
from ..service.views import supply_by_model
from . import user_namespace as un
from .egress import POLICY_NAME, metadata_egress_policy

log = logging.getLogger("gpu_offload.hub")
RBAC_RETRIES = 8
"""Attempts when the API answers 403 right after a RoleBinding was made (RBAC caches catch up in seconds)."""
RBAC_BACKOFF = Backoff(first=0.25, cap=5.0, attempts=RBAC_RETRIES)


async def _create(what: str, call: Callable[[], Awaitable[Any]], retries: int = RBAC_RETRIES) -> bool:
    """Create one object: True when created, False when it already existed; 403 is retried with backoff."""

    async def create() -> None:
        try:
            await call()
        except ApiException as exc:
            raise api_error(exc, "creating", what) from exc

    def note(exc: Exception, failures: int, pause: float) -> None:
        log.info("creating %s: 403, RBAC may still be propagating; retry %d in %.2fs", what, failures, pause)

    try:
        await retry_async(create, dataclasses.replace(RBAC_BACKOFF, attempts=retries),
                          lambda exc: isinstance(exc, APIForbidden), note)
    except APIConflict:
        return False
    return True


async def prepare_namespace(api_client: Any, name: str, config: HubConfig,
                            extra_labels: dict[str, str] | None = None, retries: int = RBAC_RETRIES,
                            user: str = "", groups: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Namespace, the two RoleBindings, the users' server account, the GPU quota (when the admin set one) or,
    with queueing on, the LocalQueue and the priority classes ``user`` (in ``groups``) may use (and no quota),
    the cloud-metadata NetworkPolicy, the NamespaceOffloading, in that order.

    Returns what was created (empty when everything already existed). ``retries`` bounds the attempts
    per object on 403.
    """
    # Any: kubernetes_asyncio's hints want model classes, but it sends plain dicts (API-shaped) unchanged.
    core: Any = CoreV1Api(api_client)
    rbac: Any = RbacAuthorizationV1Api(api_client)
    custom: Any = CustomObjectsApi(api_client)
    networking: Any = NetworkingV1Api(api_client)
    offloading = un.offloading(name, config)  # built (and validated) before anything is written
    created: list[str] = []
    body = un.namespace(name, extra_labels, user, config.user_namespaces.pod_security)
    if await _create(f"namespace {name}", lambda: core.create_namespace(body), retries):
        created.append(f"Namespace {name}")
    for binding in un.role_bindings(name, config):
        what = f"RoleBinding {name}/{binding['metadata']['name']}"
        if await _create(what, functools.partial(rbac.create_namespaced_role_binding, name, binding), retries):
            created.append(what)
    account = un.service_account(name, config)
    what = f"ServiceAccount {name}/{account['metadata']['name']}"
    if await _create(what, lambda: core.create_namespaced_service_account(name, account), retries):
        created.append(what)
    quota = un.gpu_quota(name, config)
    if config.queueing is not None:
        await _drop_quota(core, name)
        what = f"LocalQueue {name}/{config.queueing.local_queue}"
        queue = un.local_queue(name, config)
        g = L.LOCAL_QUEUE
        if await _create(what, lambda: custom.create_namespaced_custom_object(g.group, g.version, name, g.plural,
                                                                             queue), retries):
            created.append(what)
        await _priority_classes(core, name, config, user, groups, created, retries)
    elif quota is not None:
        what = f"ResourceQuota {name}/{un.QUOTA_NAME}"
        if await _create(what, lambda: core.create_namespaced_resource_quota(name, quota), retries):
            created.append(what)
        else:  # there from an earlier spawn: bring it to the configured share (the admin may have changed it)
            try:
                await core.patch_namespaced_resource_quota(un.QUOTA_NAME, name, {"spec": quota["spec"]})
            except ApiException as exc:
                raise api_error(exc, "updating", what) from exc
    await _object_quota(core, name, config, created, retries)
    what = f"NetworkPolicy {name}/{POLICY_NAME}"
    policy = metadata_egress_policy(name)
    if await _create(what, lambda: networking.create_namespaced_network_policy(name, policy), retries):
        created.append(what)
    g = L.NAMESPACE_OFFLOADING
    what = f"NamespaceOffloading {name}/{L.NAMESPACE_OFFLOADING_NAME}"
    if await _create(what, lambda: custom.create_namespaced_custom_object(g.group, g.version, name, g.plural,
                                                                         offloading), retries):
        created.append(what)
    elif config.trusted_only:  # there from an earlier spawn, perhaps before trustedOnly: narrow it now
        try:
            # a JSON patch of these two fields only: namespaceMappingStrategy, set by Liqo, cannot change
            await custom.patch_namespaced_custom_object(g.group, g.version, name, g.plural, L.NAMESPACE_OFFLOADING_NAME, [
                {"op": "add", "path": f"/spec/{key}", "value": offloading["spec"][key]}
                for key in ("podOffloadingStrategy", "clusterSelector")])
        except ApiException as exc:
            raise api_error(exc, "updating", what) from exc
    else:
        await _keep_pods_local(custom, name, offloading["spec"]["podOffloadingStrategy"], what)
    return created


async def _keep_pods_local(custom: Any, name: str, strategy: str, what: str) -> None:
    """Bring a NamespaceOffloading an earlier version wrote (LocalAndRemote: every pod of the namespace could
    reach a donor) to ``strategy``; Liqo allows the change, and pods already on donors stay there until they end."""
    g = L.NAMESPACE_OFFLOADING
    try:
        current = await custom.get_namespaced_custom_object(g.group, g.version, name, g.plural,
                                                            L.NAMESPACE_OFFLOADING_NAME)
        if (current.get("spec") or {}).get("podOffloadingStrategy") != strategy:
            await custom.patch_namespaced_custom_object(g.group, g.version, name, g.plural, L.NAMESPACE_OFFLOADING_NAME,
                                                        {"spec": {"podOffloadingStrategy": strategy}},
                                                        _content_type="application/merge-patch+json")
            log.info("%s: podOffloadingStrategy set to %s", what, strategy)
    except ApiException as exc:
        raise api_error(exc, "updating", what) from exc


async def _object_quota(core: Any, name: str, config: HubConfig, created: list[str], retries: int) -> None:
    """Write the object counts the namespace may hold; one from an earlier spawn is brought to the chart's."""
    quota = un.object_quota(name, config)
    if quota is None:
        return
    what = f"ResourceQuota {name}/{un.OBJECT_QUOTA_NAME}"
    if await _create(what, lambda: core.create_namespaced_resource_quota(name, quota), retries):
        created.append(what)
        return
    try:
        await core.patch_namespaced_resource_quota(un.OBJECT_QUOTA_NAME, name, {"spec": quota["spec"]})
    except ApiException as exc:
        raise api_error(exc, "updating", what) from exc


async def _priority_classes(core: Any, name: str, config: HubConfig, user: str, groups: list[str] | tuple[str, ...],
                            created: list[str], retries: int) -> None:
    """Write the classes the user may use now (membership and the chart may have changed since the last spawn)."""
    body = un.priority_classes(name, config, user, groups)
    what = f"ConfigMap {name}/{un.PRIORITY_CLASSES_NAME}"
    if await _create(what, lambda: core.create_namespaced_config_map(name, body), retries):
        created.append(what)
        return
    try:
        await core.replace_namespaced_config_map(un.PRIORITY_CLASSES_NAME, name, body)
    except ApiException as exc:
        raise api_error(exc, "updating", what) from exc


async def _drop_quota(core: Any, name: str) -> None:
    """Delete the GPU ResourceQuota an earlier spawn wrote before queueing was turned on (see ``gpu_quota``)."""
    try:
        await core.delete_namespaced_resource_quota(un.QUOTA_NAME, name)
    except ApiException as exc:
        error = api_error(exc, "deleting", f"ResourceQuota {name}/{un.QUOTA_NAME}")
        if not isinstance(error, APINotFound):
            raise error from exc


async def pre_spawn_hook(spawner: Any) -> None:
    """Before a user's server starts: make its namespace offloaded and set the magic's environment."""
    config = load_config()
    labels = {k: str(v) for k, v in (getattr(spawner, "user_namespace_labels", None) or {}).items()
              if "{" not in str(v)}  # kubespawner expands templated values itself when it creates the namespace
    await prepare_server(spawner, spawner.api.api_client, str(spawner.namespace), config, labels)
    if not getattr(spawner, "service_account", None):
        spawner.service_account = config.user_namespaces.user_server_service_account


async def prepare_server(spawner: Any, api_client: Any, name: str, config: HubConfig,
                         labels: dict[str, str] | None = None) -> None:
    """Make ``name`` the user's offloaded namespace and set the magic's environment on the spawner."""
    name = un.check_namespace(name, config)
    groups = [str(g.name) for g in getattr(spawner.user, "groups", None) or []]
    created = await prepare_namespace(api_client, name, config, labels, user=str(spawner.user.name), groups=groups)
    if created:
        spawner.log.info("gpu-offload: prepared %s", ", ".join(created))
    service_url = read_kernel(spawner.environment).service_url or ""  # set by the chart's hub (chart_hub)
    spawner.environment.update(un.server_environment(name, config, service_url, str(spawner.user.name)))


# --- profile_list ---------------------------------------------------------------------------------------

_caches: dict[tuple[str, str], InventoryCache] = {}
_caches_lock = threading.Lock()


def inventory_cache() -> InventoryCache:
    """The watch-fed inventory cache kept for the hub's lifetime (one per API location), started on first use.

    Starting it only starts its watch threads: nothing here waits for the API.
    """
    key = (os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBECONFIG", ""))
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            client = LiqoClient(api_client_from_environment(), trust=load_config().clusters)
            cache = _caches[key] = InventoryCache(client).start()
    return cache


def start_inventory() -> None:
    """Start the cache at hub start, so that it has listed the donors by the time users open the spawn page."""
    inventory_cache()


def gpu_profiles(inventory: Inventory, currency: str = "") -> list[dict[str, Any]]:
    """One profile per labelled GPU model with free GPUs (cheapest price shown, in ``currency``), after the
    default profile."""
    profiles: list[dict[str, Any]] = [{
        "display_name": "Standard server",
        "slug": "standard",
        "description": "No remote GPU by default; %%gpu_offload still places cells on any free GPU.",
        "default": True,
    }]
    for supply in supply_by_model(inventory):
        if supply.model == "unlabelled" or supply.free < 1:
            continue  # a profile promises a model: unlabelled nodes stay reachable through "any GPU"
        unit = f" {currency}" if currency else ""
        price = "" if supply.cheapest is None else f", from {supply.cheapest:g}{unit} per GPU-hour"
        count = len(supply.clusters)
        profiles.append({
            "display_name": f"Remote GPU via Liqo: {supply.model}",
            "slug": f"liqo-gpu-{supply.model.lower()}",
            "description": f"{supply.free} free on {count} cluster{'s' if count > 1 else ''}{price}. "
                           f"%%gpu_offload cells go to a {supply.model} by default.",
            "kubespawner_override": {"environment": E.assignments({E.GPU_MODEL: supply.model})},
        })
    return profiles


NOT_READY = ("The remote GPU inventory is still loading: reload this page in a moment to choose a GPU model "
             "(%%gpu_offload places cells on any free GPU meanwhile).")


def profile_list(spawner: Any) -> list[dict[str, Any]]:
    """kubespawner's ``profile_list`` callable: the profiles for the current inventory.

    It runs on the hub's event loop, so it never waits for the API: it reads the cache as it is. Until the
    cache has listed every kind once, or when the inventory cannot be read, the standard profile alone is
    offered, saying why, so neither a slow start nor a Liqo outage keeps users from starting their servers.
    """
    try:
        cache = inventory_cache()
        if not cache.wait_synced(0):
            errors = [f"{kind}: {s['last_error']}" for kind, s in cache.stats().items() if s["last_error"]]
            return _standard_only(spawner, NOT_READY if not errors else
                                  f"Remote GPU inventory unavailable right now ({'; '.join(errors)}).")
        return gpu_profiles(cache.inventory(0), load_config().currency)
    except GpuOffloadError as exc:
        return _standard_only(spawner, f"Remote GPU inventory unavailable right now ({exc}).")


def _standard_only(spawner: Any, why: str) -> list[dict[str, Any]]:
    spawner.log.warning("gpu-offload: no GPU profiles: %s", why)
    fallback = gpu_profiles(Inventory())
    fallback[0]["description"] = why
    return fallback
