"""The hub side's configuration: the YAML file the Helm chart's ConfigMap holds, as a frozen dataclass.

The service and the spawner hook both read it from the path in ``GPU_OFFLOAD_CONFIG``. Keys are the
chart's (camelCase); a missing file or key falls back to the defaults below, so a laptop hub works with
no file at all, while a malformed file is refused naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpu_offload.liqo_peering import environment as E
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.liqo_peering.kueue import QueueSettings, queue_settings
from gpu_offload.liqo_peering.settings import hub_config_path
from gpu_offload.liqo_peering.trust import TrustPolicy, policy_from_config

USER_NAMESPACE_LABEL = L.USER_NAMESPACE
"""Fixed, not configurable: the chart's admission policy admits only namespaces carrying it."""
POD_SECURITY_LABEL = "pod-security.kubernetes.io/enforce"
POD_SECURITY_LEVELS = ("restricted", "baseline")
"""Levels a user namespace may have: "privileged" would let a notebook user run anything on the nodes."""


@dataclass(frozen=True)
class UserNamespaces:
    """How user namespaces are named and what is bound inside them (names from the chart)."""

    prefix: str = ""
    """Every user namespace name starts with it; empty means ``<hub namespace>-``."""
    hub_cluster_role: str = "gpu-offload-user-namespace"
    """ClusterRole the hook binds to the hub's account inside each user namespace."""
    user_server_cluster_role: str = "gpu-offload-user-server"
    """ClusterRole the hook binds to the users' server account inside each user namespace."""
    user_server_service_account: str = "gpu-offload-user-server"
    pod_security: str = "baseline"
    """Pod Security level enforced in user namespaces (``pod-security.kubernetes.io/enforce``)."""
    object_quota: tuple[tuple[str, int], ...] = (("pods", 50), ("secrets", 100), ("services", 20))
    """How many objects of each kind a user namespace may hold (a ResourceQuota's object counts), so that one
    user cannot flood the API server or the hub's watches; a kind at 0 is not capped."""


@dataclass(frozen=True)
class HubConfig:
    """Everything the service and the spawner hook need to know about the installation."""

    hub_namespace: str = "default"
    hub_service_account: str = "gpu-offload-hub"
    user_namespaces: UserNamespaces = field(default_factory=UserNamespaces)
    tenant_namespaces: tuple[str, ...] = ()
    """Liqo tenant namespaces the hub may write ResourceSlices and VirtualNode labels in (chart RBAC)."""
    cluster_id: str = ""
    """This (consumer) cluster's Liqo id; empty: read from an existing ResourceSlice when needed."""
    database_url: str = "sqlite:///gpu-offload-usage.sqlite"
    port: int = 10101
    default_image: str = ""
    """Runner pods' image of every user server (``GPU_OFFLOAD_IMAGE``); empty: each kernel uses the project's
    runner image for its own Python minor version."""
    placement_policy: str = "most-free"
    """Set in every user server as ``GPU_OFFLOAD_PLACEMENT_POLICY``."""
    gpu_quota_per_user: int = 0
    """GPUs one user's runs and sessions may hold at once (a ResourceQuota in their namespace); 0: no limit."""
    currency: str = ""
    """The chart's ``offload.currency`` (``EUR``, ``USD``, ``credits``): the unit of prices, costs and budgets,
    shown after them on the pages; empty: bare numbers."""
    monthly_budget_per_user: float | None = None
    """What one user's runs may cost per month (UTC), in the unit of the donors' prices; None: no budget. A
    cell that would start past it is refused before launch (the kernel checks; running cells go on)."""
    object_storage_endpoint: str = ""
    object_storage_bucket: str = ""
    trusted_only: bool = False
    """The chart's ``offload.trustedOnly``: every user's kernel places cells on trusted clusters only."""
    session_idle_timeout: int = 0
    """The chart's ``offload.sessionIdleTimeout``: seconds a session may sit idle holding GPUs before its kernel
    ends it (set in every user server as ``GPU_OFFLOAD_SESSION_IDLE_TIMEOUT``); 0: never."""
    session_notice: int = 60
    """The chart's ``offload.sessionNotice``: seconds a session pod has from SIGTERM (preemption, drain) to its
    end, to write its checkpoint (its termination grace period; ``GPU_OFFLOAD_SESSION_NOTICE``)."""
    liqoctl_enabled: bool = False
    """Run ``liqoctl peer``/``unpeer`` from the page; False shows the command instead."""
    clusters: TrustPolicy = field(default_factory=TrustPolicy)
    """The chart's ``clusters``: which donors the origin trusts, and the GPU model and price its admin set."""
    queueing: QueueSettings | None = None
    metrics_per_user: bool = True
    """The chart's ``metrics.perUserSeries``: the ``user`` label on the GPU-seconds, cost and preemption series."""
    metrics_open: bool = False
    """The chart's ``metrics.open``: serve ``/metrics`` without a token (as JupyterHub's
    ``authenticate_prometheus = False``); False: a token with ``read:metrics`` or the view scope is needed."""
    """The chart's ``queueing.kueue`` when enabled: runs queue through Kueue (docs/queueing.md); None: off."""

    @property
    def user_namespace_prefix(self) -> str:
        """The prefix user namespaces must carry (the chart's default when unset)."""
        return self.user_namespaces.prefix or f"{self.hub_namespace}-"


def _section(raw: Mapping[str, Any], key: str, where: Path | str) -> Mapping[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where}: {key} must be a mapping, got {type(value).__name__}; see the chart's ConfigMap")
    return value


QUOTA_KINDS = ("pods", "secrets", "services")


def _object_quota(raw: Any, default: tuple[tuple[str, int], ...], where: Path | str) -> tuple[tuple[str, int], ...]:
    """``userNamespaces.objectQuota``: a count (0 or more) per kind of ``QUOTA_KINDS``; kinds left out keep
    their default."""
    if raw is None:
        return default
    if not isinstance(raw, Mapping) or not set(raw) <= set(QUOTA_KINDS):
        raise InvalidRequest(f"{where}: userNamespaces.objectQuota={raw!r}; give counts for {', '.join(QUOTA_KINDS)}")
    counts = dict(default)
    for kind, value in raw.items():
        if type(value) is not int or value < 0:
            raise InvalidRequest(f"{where}: userNamespaces.objectQuota.{kind}={value!r}; give a whole number, 0 for "
                                 "no cap")
        counts[kind] = value
    return tuple((k, counts[k]) for k in QUOTA_KINDS)


def parse_config(raw: Mapping[str, Any], where: Path | str = "config") -> HubConfig:
    """A HubConfig from the ConfigMap's ``config.yaml`` content (already parsed)."""
    user_ns = _section(raw, "userNamespaces", where)
    liqo = _section(raw, "liqo", where)
    database = _section(raw, "usageDatabase", where)
    service = _section(raw, "service", where)
    offload = _section(raw, "offload", where)
    storage = _section(offload, "objectStorage", where)
    peering = _section(raw, "peering", where)
    defaults = HubConfig()
    tenants = liqo.get("tenantNamespaces") or []
    if not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants):
        raise InvalidRequest(f"{where}: liqo.tenantNamespaces must be a list of namespace names, got {tenants!r}")
    try:
        port = int(service.get("port", defaults.port))
    except (TypeError, ValueError):
        raise InvalidRequest(f"{where}: service.port={service.get('port')!r} is not a port number") from None
    base = UserNamespaces()
    from gpu_offload.liqo_peering.placement import POLICIES

    policy = str(offload.get("placementPolicy") or defaults.placement_policy)
    if policy not in POLICIES:
        raise InvalidRequest(f"{where}: offload.placementPolicy={policy!r} is not a placement policy; use one of "
                             f"{', '.join(POLICIES)}")
    quota = offload.get("gpuQuotaPerUser", 0) or 0
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise InvalidRequest(f"{where}: offload.gpuQuotaPerUser={quota!r} must be a whole number of GPUs, 0 for "
                             "no limit")
    budget = offload.get("monthlyBudgetPerUser")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
        raise InvalidRequest(f"{where}: offload.monthlyBudgetPerUser={budget!r} must be a number of 0 or more (the "
                             "cost one user may spend per month), or null for no budget")
    currency = offload.get("currency") or ""
    if not isinstance(currency, str) or len(currency) > 16 or not all(c.isalnum() or c in " .$€£¥-_" for c in currency):
        raise InvalidRequest(f"{where}: offload.currency={currency!r} must be a short unit such as EUR, USD or credits")
    trusted_only = offload.get("trustedOnly", False)
    if not isinstance(trusted_only, bool):
        raise InvalidRequest(f"{where}: offload.trustedOnly={trusted_only!r} must be true or false")
    idle = offload.get("sessionIdleTimeout", 0) or 0
    if isinstance(idle, bool) or not isinstance(idle, int) or idle < 0:
        raise InvalidRequest(f"{where}: offload.sessionIdleTimeout={idle!r} must be a whole number of seconds, 0 "
                             "for never")
    notice = offload.get("sessionNotice", HubConfig.session_notice)
    if isinstance(notice, bool) or not isinstance(notice, int) or notice < 0:
        raise InvalidRequest(f"{where}: offload.sessionNotice={notice!r} must be a whole number of seconds (the time "
                             f"a session's pod has to write its checkpoint when told to stop; "
                             f"{HubConfig.session_notice} by default)")
    try:
        clusters = policy_from_config(raw.get("clusters"))
    except ValueError as exc:
        raise InvalidRequest(f"{where}: {exc} (the chart's clusters value)") from None
    queueing = _queueing(_section(raw, "queueing", where), where)
    metrics_open = _section(raw, "metrics", where).get("open", False)
    if not isinstance(metrics_open, bool):
        raise InvalidRequest(f"{where}: metrics.open={metrics_open!r} must be true or false")
    per_user = _section(raw, "metrics", where).get("perUserSeries", True)
    if not isinstance(per_user, bool):
        raise InvalidRequest(f"{where}: metrics.perUserSeries={per_user!r} must be true or false")
    object_quota = _object_quota(user_ns.get("objectQuota"), base.object_quota, where)
    pod_security = str(user_ns.get("podSecurity") or base.pod_security)
    if pod_security not in POD_SECURITY_LEVELS:
        raise InvalidRequest(f"{where}: userNamespaces.podSecurity={pod_security!r}; use one of "
                             f"{', '.join(POD_SECURITY_LEVELS)}")
    return HubConfig(
        clusters=clusters,
        hub_namespace=str(raw.get("hubNamespace") or defaults.hub_namespace),
        hub_service_account=str(raw.get("hubServiceAccount") or defaults.hub_service_account),
        user_namespaces=UserNamespaces(
            prefix=str(user_ns.get("prefix") or ""),
            hub_cluster_role=str(user_ns.get("hubClusterRole") or base.hub_cluster_role),
            user_server_cluster_role=str(user_ns.get("userServerClusterRole") or base.user_server_cluster_role),
            user_server_service_account=str(
                user_ns.get("userServerServiceAccount") or base.user_server_service_account
            ),
            pod_security=pod_security,
            object_quota=object_quota,
        ),
        tenant_namespaces=tuple(tenants),
        cluster_id=str(liqo.get("clusterID") or ""),
        database_url=str(database.get("url") or defaults.database_url),
        port=port,
        default_image=str(offload.get("defaultImage") or defaults.default_image),
        placement_policy=policy,
        gpu_quota_per_user=quota,
        monthly_budget_per_user=None if budget is None else float(budget),
        currency=currency,
        object_storage_endpoint=str(storage.get("endpoint") or ""),
        object_storage_bucket=str(storage.get("bucket") or ""),
        trusted_only=trusted_only,
        session_idle_timeout=idle,
        session_notice=notice,
        liqoctl_enabled=bool(peering.get("liqoctlEnabled", False)),
        queueing=queueing,
        metrics_open=metrics_open,
        metrics_per_user=per_user,
    )


def _queueing(section: Mapping[str, Any], where: Path | str) -> QueueSettings | None:
    kueue = _section(section, "kueue", where)
    if not kueue.get("enabled", False):
        return None
    try:
        return queue_settings({k: v for k, v in kueue.items() if k != "enabled"})
    except ValueError as exc:
        raise InvalidRequest(f"{where}: {exc} (the chart's queueing.kueue value)") from None


def load_config(path: str | os.PathLike[str] | None = None) -> HubConfig:
    """The configuration from ``path``, else from ``$GPU_OFFLOAD_CONFIG``, else the defaults."""
    chosen = path or hub_config_path(os.environ)
    if not chosen:
        return HubConfig()
    file = Path(chosen)
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except OSError as exc:
        raise InvalidRequest(
            f"gpu-offload configuration {file} cannot be read ({exc.strerror}); check {E.HUB_CONFIG.name} and the "
            "ConfigMap volume mount"
        ) from exc
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"gpu-offload configuration {file} is not valid YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"gpu-offload configuration {file} must be a mapping at the top level")
    return parse_config(raw, file)
