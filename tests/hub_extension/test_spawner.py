"""pre_spawn_hook and profile_list on a real KubeSpawner configured against the sandbox origin.

Each scenario runs in a child process that starts with the sandbox's kubeconfig in its environment,
as the hub process does (kubernetes_asyncio reads KUBECONFIG when imported); see data/spawner_driver.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from gpu_offload.hub_extension import user_namespace as un
from gpu_offload.hub_extension.config import parse_config
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.sandbox.origin import RunningOrigin
from gpu_offload.sandbox.resources import ResourceType

HUB_NS = "jhub"
DRIVER = Path(__file__).resolve().parent / "data" / "spawner_driver.py"
CONFIG = {
    "hubNamespace": HUB_NS, "hubServiceAccount": "gpu-offload-hub",
    "userNamespaces": {"prefix": f"{HUB_NS}-", "hubClusterRole": "gpu-offload-user-namespace",
                       "userServerClusterRole": "gpu-offload-user-server",
                       "userServerServiceAccount": "gpu-offload-user-server"},
    "offload": {"defaultImage": "python:3.12-slim", "placementPolicy": "bin-pack", "gpuQuotaPerUser": 2},
}


@pytest.fixture(scope="module")
def drive(origin: RunningOrigin, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """``drive(scenario=..., user=...)``: run one spawner scenario in a hub-like child process."""
    # The sandbox serves no RBAC kinds yet; RoleBindings are plain built-in objects to it (stored,
    # validated, listed), which is all the hook needs. Added through its registry's extension point.
    if origin.sandbox.api.registry.by_kind("rbac.authorization.k8s.io/v1", "RoleBinding") is None:
        origin.sandbox.api.registry.add(ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding",
                                                     True, "rolebinding"))
    folder = tmp_path_factory.mktemp("hubenv")
    (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_CONFIG=str(folder / "config.yaml"))

    def run(**args: Any) -> dict[str, Any]:
        done = subprocess.run([sys.executable, str(DRIVER), json.dumps(args)], env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    return run


@pytest.fixture(scope="module")
def k8s(origin: RunningOrigin) -> Any:
    client = origin.sandbox.api_client()
    yield client
    client.close()


def test_hook_offloads_the_user_namespace_and_sets_the_magic_environment(
    drive: Callable[..., dict[str, Any]], k8s: Any, validate: Any
) -> None:
    result = drive(scenario="hook", user="alice")
    assert "error" not in result, result
    ns = "jhub-alice"
    assert result["namespace"] == ns
    core = kubernetes.client.CoreV1Api(k8s)
    labels = core.read_namespace(ns).metadata.labels
    assert labels["gpu-offload.io/user-namespace"] == "true"
    assert labels["hub.jupyter.org/network-access-hub"] == "true"
    rbac = kubernetes.client.RbacAuthorizationV1Api(k8s)
    bindings = {b.metadata.name: b for b in rbac.list_namespaced_role_binding(ns).items}
    assert bindings["gpu-offload-hub"].role_ref.name == "gpu-offload-user-namespace"
    assert [(s.name, s.namespace) for s in bindings["gpu-offload-hub"].subjects] == [("gpu-offload-hub", HUB_NS)]
    assert bindings["gpu-offload-user-server"].role_ref.name == "gpu-offload-user-server"
    assert [(s.name, s.namespace) for s in bindings["gpu-offload-user-server"].subjects] == [
        ("gpu-offload-user-server", ns)]
    core.read_namespaced_service_account("gpu-offload-user-server", ns)
    offloading = kubernetes.client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings", "offloading")
    validate({k: v for k, v in offloading.items() if k != "status"})
    assert offloading["spec"]["podOffloadingStrategy"] == "LocalAndRemote"
    env = result["environment"]
    assert env["GPU_OFFLOAD_BACKEND"] == "kubernetes" and env["GPU_OFFLOAD_NAMESPACE"] == ns
    assert env["GPU_OFFLOAD_SERVICE_URL"] == "http://hub.jhub.svc:10101/services/gpu-offload/"
    assert env["GPU_OFFLOAD_IMAGE"] == "python:3.12-slim" and env["GPU_OFFLOAD_PLACEMENT_POLICY"] == "bin-pack"
    assert env["GPU_OFFLOAD_METERED"] == "1"  # the hub's meter releases the runner pods' finalizer
    assert result["service_account"] == "gpu-offload-user-server"
    quota = core.read_namespaced_resource_quota("gpu-offload", ns)
    assert quota.spec.hard == {"requests.nvidia.com/gpu": "2"}
    # the next spawn of the same user finds everything in place and succeeds
    again = drive(scenario="hook", user="alice")
    assert "error" not in again, again


def test_objects_the_hook_writes_are_valid(validate: Any) -> None:
    config = parse_config(CONFIG)
    validate(un.namespace("jhub-bob", {"hub.jupyter.org/network-access-hub": "true"}))
    for binding in un.role_bindings("jhub-bob", config):
        validate(binding)
    validate(un.service_account("jhub-bob", config))


def test_hook_retries_while_rbac_catches_up(drive: Callable[..., dict[str, Any]], origin: RunningOrigin,
                                            k8s: Any) -> None:
    path = r"/apis/rbac.authorization.k8s.io/v1/namespaces/jhub-carol/rolebindings$"
    origin.faults.api_error(path, status=403, methods=("POST",), times=2)
    try:
        result = drive(scenario="hook", user="carol")
        fired = origin.faults.active()
    finally:
        origin.faults.clear()
    assert "error" not in result, result
    assert [r["fired"] for r in fired["apiRules"]] == [2]  # refused twice, then the hook got through
    rbac = kubernetes.client.RbacAuthorizationV1Api(k8s)
    assert {b.metadata.name for b in rbac.list_namespaced_role_binding("jhub-carol").items} == {
        "gpu-offload-hub", "gpu-offload-user-server"}


def test_hook_gives_up_on_lasting_403_naming_the_object(drive: Callable[..., dict[str, Any]],
                                                       origin: RunningOrigin) -> None:
    origin.faults.api_error(r"/api/v1/namespaces/jhub-dave/serviceaccounts$", status=403, methods=("POST",))
    try:
        result = drive(scenario="prepare", user="dave", retries=2)
    finally:
        origin.faults.clear()
    assert result.get("error") == "APIForbidden", result
    assert "ServiceAccount jhub-dave/gpu-offload-user-server" in result["message"]
    assert "403" in result["message"] and "RBAC" in result["message"]


def test_hook_refuses_a_namespace_outside_the_prefix_and_creates_nothing(
    drive: Callable[..., dict[str, Any]], k8s: Any
) -> None:
    result = drive(scenario="hook", user="erin", template="users-{username}")
    assert result.get("error") == "InvalidRequest", result
    assert "'jhub-'" in result["message"] and "user_namespace_template" in result["message"]
    names = {n.metadata.name for n in kubernetes.client.CoreV1Api(k8s).list_namespace().items}
    assert "users-erin" not in names


def test_profile_list_offers_the_live_gpus_and_the_choice_reaches_the_server(
    drive: Callable[..., dict[str, Any]]
) -> None:
    result = drive(scenario="profiles", user="frank", choose="liqo-gpu-a100")
    assert "error" not in result, result
    by_slug = {p["slug"]: p for p in result["profiles"]}
    assert set(by_slug) == {"standard", "liqo-gpu-a100"}
    assert by_slug["liqo-gpu-a100"]["description"].startswith("8 free on 2 clusters, from 2 per GPU-hour")
    assert "Remote GPU via Liqo: A100" in result["form"]
    assert result["environment"]["GPU_OFFLOAD_GPU_MODEL"] == "A100"


def test_a_placement_policy_the_magic_does_not_know_stops_the_configuration() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_config({**CONFIG, "offload": {"placementPolicy": "fastest"}}, "config.yaml")
    assert "config.yaml: offload.placementPolicy='fastest'" in str(err.value)
    assert "most-free, bin-pack, first-fit" in str(err.value)


def test_a_quota_left_from_an_earlier_configuration_is_brought_to_the_configured_share(
    drive: Callable[..., dict[str, Any]], k8s: Any
) -> None:
    core = kubernetes.client.CoreV1Api(k8s)
    ns = "jhub-quinn"
    core.create_namespace({"metadata": {"name": ns, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpu-offload"},
                                               "spec": {"hard": {"requests.nvidia.com/gpu": "8"}}})
    result = drive(scenario="hook", user="quinn")
    assert "error" not in result, result
    assert core.read_namespaced_resource_quota("gpu-offload", ns).spec.hard == {"requests.nvidia.com/gpu": "2"}


@pytest.mark.parametrize("value", [-1, "two", True])
def test_a_gpu_quota_that_is_not_a_whole_number_stops_the_configuration(value: Any) -> None:
    with pytest.raises(InvalidRequest, match=r"offload.gpuQuotaPerUser=.* must be a whole number of GPUs"):
        parse_config({**CONFIG, "offload": {"gpuQuotaPerUser": value}}, "config.yaml")
