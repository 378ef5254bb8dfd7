"""ResourceQuota on pod creation, as kube-apiserver enforces it: the real client gets the 403 with the
"exceeded quota" message, terminal pods stop counting, namespaces without a quota are not limited."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from ..conftest import pod_body


def _gpu_pod(name: str, gpus: int = 1, cpu: str | None = None) -> dict[str, Any]:
    body = pod_body(name)
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if cpu:
        limits["cpu"] = cpu
    body["spec"]["containers"][0]["resources"] = {"limits": limits}
    return body


def _quota(core: Any, ns: str, **hard: str) -> None:
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpu-offload"},
                                               "spec": {"hard": {k.replace("_", "."): v for k, v in hard.items()}}})


def test_a_pod_beyond_the_gpu_quota_is_forbidden_with_kube_apiservers_message(core: Any, ns: str) -> None:
    _quota(core, ns, **{"requests_nvidia.com/gpu": "2"})
    core.create_namespaced_pod(ns, _gpu_pod("first", 2))
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.create_namespaced_pod(ns, _gpu_pod("second", 1))
    assert err.value.status == 403
    assert ('pods \\"second\\" is forbidden: exceeded quota: gpu-offload, requested: requests.nvidia.com/gpu=1, '
            'used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2') in err.value.body
    assert [p.metadata.name for p in core.list_namespaced_pod(ns).items] == ["first"]  # nothing half-made


def test_a_finished_pod_frees_its_share_and_other_namespaces_are_not_limited(core: Any, ns: str) -> None:
    _quota(core, ns, **{"requests_nvidia.com/gpu": "1"})
    core.create_namespaced_pod(ns, _gpu_pod("done", 1))
    core.patch_namespaced_pod_status("done", ns, {"status": {"phase": "Succeeded"}})
    core.create_namespaced_pod(ns, _gpu_pod("next", 1))  # the finished pod no longer counts
    other = f"{ns}-free"
    core.create_namespace({"metadata": {"name": other}})
    try:
        core.create_namespaced_pod(other, _gpu_pod("big", 8))
    finally:
        core.delete_namespace(other)


def test_cpu_and_pod_count_quotas_count_requests_defaulted_from_limits(core: Any, ns: str) -> None:
    _quota(core, ns, cpu="3", pods="5")
    core.create_namespaced_pod(ns, _gpu_pod("a", 1, cpu="2"))
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.create_namespaced_pod(ns, _gpu_pod("b", 1, cpu="1500m"))
    assert "requested: cpu=1500m, used: cpu=2, limited: cpu=3" in err.value.body
