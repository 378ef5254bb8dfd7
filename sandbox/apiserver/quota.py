"""ResourceQuota admission for pods, as kube-apiserver's quota plugin enforces it at creation.

A pod is refused (403 Forbidden, with kube-apiserver's "exceeded quota" message) when, with it, the pods of
its namespace would hold more than a quota's ``hard`` limit. Counted: ``pods``, ``count/pods``, ``cpu`` and
``memory`` (the requests), ``requests.<resource>`` and ``limits.<resource>``, extended resources such as
``requests.nvidia.com/gpu`` included. Like kube-apiserver, pods in a terminal phase do not count, and a
container's missing request is its limit (the API server defaults it so). Object counts of Secrets, ConfigMaps
and Services (``secrets``, ``count/secrets``, ...) are enforced the same way on their creation. ``status.used``
is not kept up to date (a controller's job in a real cluster); the refusal message carries the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from .admission import AdmissionRequest
from .errors import ApiError

_TERMINAL = ("Succeeded", "Failed")


def _container_amounts(container: Mapping[str, Any]) -> dict[str, Decimal]:
    res = container.get("resources") or {}
    limits = res.get("limits") or {}
    requests = {**limits, **(res.get("requests") or {})}
    out: dict[str, Decimal] = {}
    for kind, values in (("requests", requests), ("limits", limits)):
        for name, qty in values.items():
            out[f"{kind}.{name}"] = parse_quantity(qty)
    return out


def pod_usage(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What one pod counts against quotas, under the quota's own key names."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for container in spec.get("containers") or []:
        for key, value in _container_amounts(container).items():
            total[key] = total.get(key, Decimal(0)) + value
    for container in spec.get("initContainers") or []:  # init containers run one at a time: the largest
        for key, value in _container_amounts(container).items():
            total[key] = max(total.get(key, Decimal(0)), value)
    for plain in ("cpu", "memory"):
        if f"requests.{plain}" in total:
            total[plain] = total[f"requests.{plain}"]
    return total


def _show(key: str, value: Decimal) -> str:
    """``key=quantity`` in Kubernetes' canonical spelling: ``2``, ``1500m``, ``8Gi``."""
    if value != value.to_integral_value():
        return f"{key}={int(value * 1000)}m"
    number = int(value)
    for suffix, size in (("Gi", 2**30), ("Mi", 2**20)):
        if number and number % size == 0:
            return f"{key}={number // size}{suffix}"
    return f"{key}={number}"


def quota_hook(api: Any) -> Any:
    """The validating hook for pod creation, reading quotas and pods from ``api`` (under the store lock)."""

    def check(req: AdmissionRequest) -> None:
        rt_quota = api.registry.by_kind("v1", "ResourceQuota")
        quotas = api.list(rt_quota, req.namespace)["items"]
        if not quotas:
            return
        pods = api.list(req.resource, req.namespace, copy=False)["items"]
        counted = [p for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL
                   and not (p.get("metadata") or {}).get("deletionTimestamp")]
        wanted = pod_usage(req.object)
        for quota in quotas:
            hard = (quota.get("spec") or {}).get("hard") or {}
            for key, limit in hard.items():
                asked = wanted.get(key)
                if not asked:
                    continue
                used = sum((pod_usage(p).get(key, Decimal(0)) for p in counted), Decimal(0))
                if used + asked > parse_quantity(limit):
                    name = quota["metadata"]["name"]
                    raise ApiError(403, "Forbidden", (
                        f'pods "{req.name}" is forbidden: exceeded quota: {name}, requested: {_show(key, asked)}, '
                        f"used: {_show(key, used)}, limited: {_show(key, parse_quantity(limit))}"),
                        req.name, "", "pods")

    return check


COUNTED = ("secrets", "configmaps", "services")
"""Kinds whose object count a quota may cap (besides pods), by their resource name."""


def count_hook(api: Any, plural: str) -> Any:
    """The validating hook refusing a ``plural`` object the namespace's quotas have no room for."""

    def check(req: AdmissionRequest) -> None:
        quotas = api.list(api.registry.by_kind("v1", "ResourceQuota"), req.namespace)["items"]
        limits = [(q["metadata"]["name"], key, parse_quantity(value)) for q in quotas
                  for key, value in ((q.get("spec") or {}).get("hard") or {}).items()
                  if key in (plural, f"count/{plural}")]
        if not limits:
            return
        existing = api.list(req.resource, req.namespace, copy=False)["items"]
        used = Decimal(sum(1 for o in existing if not (o.get("metadata") or {}).get("deletionTimestamp")))
        for name, key, limit in limits:
            if used + 1 > limit:
                raise ApiError(403, "Forbidden", (
                    f'{plural} "{req.name}" is forbidden: exceeded quota: {name}, requested: {_show(key, Decimal(1))}, '
                    f"used: {_show(key, used)}, limited: {_show(key, limit)}"), req.name, "", plural)

    return check


def install(api: Any) -> None:
    """Enforce the ResourceQuotas of each namespace on the creation of pods and of counted objects."""
    api.admission.add_validating("pods", quota_hook(api), ("CREATE",))
    for plural in COUNTED:
        api.admission.add_validating(plural, count_hook(api, plural), ("CREATE",))
