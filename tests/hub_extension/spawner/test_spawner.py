"""pre_spawn_hook and profile_list on a real KubeSpawner configured against the sandbox origin.

Each scenario runs in a child process that starts with the sandbox's kubeconfig in its environment,
as the hub process does (kubernetes_asyncio reads KUBECONFIG when imported); see data/spawner_driver.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from gpu_offload.hub_extension.config import parse_config
from gpu_offload.hub_extension.spawner import user_namespace as un
from gpu_offload.hub_extension.spawner.egress import metadata_egress_policy
from gpu_offload.liqo_peering.errors import InvalidRequest
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox.apiserver.resources import ResourceType
from gpu_offload.sandbox.fixtures import install_crds, wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

HUB_NS = "jhub"
DRIVER = Path(__file__).resolve().parent / "data" / "spawner_driver.py"
REPO = Path(__file__).resolve().parents[3]
CONFIG = {
    "hubNamespace": HUB_NS, "hubServiceAccount": "gpu-offload-hub",
    "userNamespaces": {"prefix": f"{HUB_NS}-", "hubClusterRole": "gpu-offload-user-namespace",
                       "userServerClusterRole": "gpu-offload-user-server",
                       "userServerServiceAccount": "gpu-offload-user-server", "podSecurity": "restricted"},
    "offload": {"defaultImage": "python:3.12-slim", "placementPolicy": "bin-pack", "gpuQuotaPerUser": 2},
    "clusters": {"donor-2": {"trusted": True}, "donor-1": {"trusted": False, "gpuModel": "A100"}},
}


def _driver(origin: RunningOrigin, folder: Path, config: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """``drive(scenario=..., user=...)``: run one spawner scenario in a hub-like child process with ``config``."""
    # The sandbox serves no RBAC kinds yet; RoleBindings are plain built-in objects to it (stored,
    # validated, listed), which is all the hook needs. Added through its registry's extension point.
    if origin.sandbox.api.registry.by_kind("rbac.authorization.k8s.io/v1", "RoleBinding") is None:
        origin.sandbox.api.registry.add(ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding",
                                                     True, "rolebinding"))
    if origin.sandbox.api.registry.by_kind("networking.k8s.io/v1", "NetworkPolicy") is None:
        origin.sandbox.api.registry.add(ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy",
                                                     True, "networkpolicy"))
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_CONFIG=str(folder / "config.yaml"))

    def run(**args: Any) -> dict[str, Any]:
        done = subprocess.run([sys.executable, str(DRIVER), json.dumps(args)], env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    return run


@pytest.fixture(scope="module")
def drive(origin: RunningOrigin, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """The hook with the module's CONFIG (no queueing)."""
    return _driver(origin, tmp_path_factory.mktemp("hubenv"), CONFIG)


def test_hook_offloads_the_user_namespace_and_sets_the_magic_environment(
    drive: Callable[..., dict[str, Any]], api_client: Any, validate: Any
) -> None:
    result = drive(scenario="hook", user="alice")
    assert "error" not in result, result
    ns = "jhub-alice"
    assert result["namespace"] == ns
    core = kubernetes.client.CoreV1Api(api_client)
    labels = core.read_namespace(ns).metadata.labels
    assert labels["gpu-offload.io/user-namespace"] == "true"
    assert labels["hub.jupyter.org/network-access-hub"] == "true"
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
    bindings = {b.metadata.name: b for b in rbac.list_namespaced_role_binding(ns).items}
    assert bindings["gpu-offload-hub"].role_ref.name == "gpu-offload-user-namespace"
    assert [(s.name, s.namespace) for s in bindings["gpu-offload-hub"].subjects] == [("gpu-offload-hub", HUB_NS)]
    assert bindings["gpu-offload-user-server"].role_ref.name == "gpu-offload-user-server"
    assert [(s.name, s.namespace) for s in bindings["gpu-offload-user-server"].subjects] == [
        ("gpu-offload-user-server", ns)]
    core.read_namespaced_service_account("gpu-offload-user-server", ns)
    offloading = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings", "offloading")
    validate({k: v for k, v in offloading.items() if k != "status"})
    assert offloading["spec"]["podOffloadingStrategy"] == "Local"  # only pods placed by the project leave
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


def test_the_namespace_names_its_user_and_enforces_the_configured_pod_security_level(
    drive: Callable[..., dict[str, Any]], api_client: Any
) -> None:
    result = drive(scenario="hook", user="erin")
    assert "error" not in result, result
    meta = kubernetes.client.CoreV1Api(api_client).read_namespace("jhub-erin").metadata
    assert meta.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert meta.annotations["gpu-offload.io/user"] == "erin"  # what the meter bills runs in it to
    # z2jh's privileged iptables block cannot run under Pod Security: this NetworkPolicy replaces it
    (policy,) = kubernetes.client.NetworkingV1Api(api_client).list_namespaced_network_policy("jhub-erin").items
    assert policy.spec.pod_selector.to_dict() == {"match_expressions": None, "match_labels": None}
    assert policy.spec.egress[0].to[0].ip_block.to_dict() == {"cidr": "0.0.0.0/0", "_except": ["169.254.169.254/32"]}
    assert {p.port for p in policy.spec.egress[1].ports} == {53}
    # the chart's trusted clusters reach a server that reads the cluster directly, too; donor-1 is not trusted
    assert result["environment"]["GPU_OFFLOAD_TRUSTED_CLUSTERS"] == "donor-2"


def egress_allowed(policy: dict[str, Any], address: str, port: int) -> bool:
    """Whether a NetworkPolicy's egress rules (ipBlock peers only, as the spawner's has) let a pod reach
    ``address``:``port``, as a CNI enforcing it decides."""
    import ipaddress

    ip = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        ports = rule.get("ports")
        if ports and all(p["port"] != port for p in ports):
            continue
        for peer in rule["to"]:
            block = peer["ipBlock"]
            net = ipaddress.ip_network(block["cidr"])
            if ip.version == net.version and ip in net and not any(
                    ip in ipaddress.ip_network(e) for e in block.get("except", []) if ipaddress.ip_network(e).version == ip.version):
                return True
    return False


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "fe80::a9fe:a9fe"])
def test_no_pod_of_a_user_namespace_reaches_the_metadata_server_over_ipv4_or_ipv6(address: str) -> None:
    policy = metadata_egress_policy("jhub-bob")
    assert not egress_allowed(policy, address, 80)
    assert egress_allowed(policy, address, 53)  # DNS, as z2jh keeps it open
    assert egress_allowed(policy, "2001:db8::1", 443) and egress_allowed(policy, "93.184.216.34", 443)


def test_a_pod_security_level_that_would_open_the_namespace_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="podSecurity='privileged'.*restricted, baseline"):
        parse_config({"userNamespaces": {"podSecurity": "privileged"}})
    with pytest.raises(InvalidRequest, match="donor-1.trusted.*true or false.*clusters value"):
        parse_config({"clusters": {"donor-1": {"trusted": "yes"}}})
    assert parse_config({}).user_namespaces.pod_security == "baseline"
    assert parse_config({}).clusters.trusted_ids == ()


def test_objects_the_hook_writes_are_valid(validate: Any) -> None:
    config = parse_config(CONFIG)
    validate(un.namespace("jhub-bob", {"hub.jupyter.org/network-access-hub": "true"}, "bob@example.org",
                          "restricted"))
    for binding in un.role_bindings("jhub-bob", config):
        validate(binding)
    validate(un.service_account("jhub-bob", config))
    validate(metadata_egress_policy("jhub-bob"))


def test_hook_retries_while_rbac_catches_up(drive: Callable[..., dict[str, Any]], origin: RunningOrigin,
                                            api_client: Any) -> None:
    path = r"/apis/rbac.authorization.k8s.io/v1/namespaces/jhub-carol/rolebindings$"
    origin.faults.api_error(path, status=403, methods=("POST",), times=2)
    try:
        result = drive(scenario="hook", user="carol")
        fired = origin.faults.active()
    finally:
        origin.faults.clear()
    assert "error" not in result, result
    assert [r["fired"] for r in fired["apiRules"]] == [2]  # refused twice, then the hook got through
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
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
    drive: Callable[..., dict[str, Any]], api_client: Any
) -> None:
    result = drive(scenario="hook", user="erin", template="users-{username}")
    assert result.get("error") == "InvalidRequest", result
    assert "'jhub-'" in result["message"] and "user_namespace_template" in result["message"]
    names = {n.metadata.name for n in kubernetes.client.CoreV1Api(api_client).list_namespace().items}
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


def test_the_spawn_page_does_not_wait_for_an_inventory_that_is_not_ready(
    origin: RunningOrigin, tmp_path: Path
) -> None:
    """The inventory's first list of virtual nodes is held by the API server: the spawn page still renders at
    once with the standard profile saying why, the hub's loop keeps serving, and the GPU profiles appear on
    the next visit once the list gets through, with no restart."""
    from gpu_offload.sandbox.apiserver.http_faults import FaultRule

    faults = origin.sandbox.api.faults
    rule = faults.add(FaultRule(path=r"/apis/offloading.liqo.io/v1beta1/virtualnodes$", methods=("GET",),
                                hold=True, delay=120.0))
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env.update(KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_CONFIG=str(tmp_path / "config.yaml"))
    driver = subprocess.Popen([sys.executable, str(DRIVER), json.dumps({"scenario": "profiles_held", "user": "gina"})],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        first = driver.stdout.readline()
        assert json.loads(first) == {"held": True}, first + driver.stderr.read()
        assert faults.fired(rule) >= 1  # the page was answered while the list was still held
        faults.release(rule)
        faults.remove(rule)
        driver.stdin.write("released\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=180)
    finally:
        faults.remove(rule)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    result = json.loads(out.strip().splitlines()[-1])
    assert "error" not in result, (result, err[-2000:])
    (standard,) = result["held_profiles"]
    assert standard["slug"] == "standard" and "still loading" in standard["description"]
    assert "still loading" in result["held_form"]
    assert result["served"] >= 1
    assert result["synced"] is True
    assert {p["slug"] for p in result["profiles"]} == {"standard", "liqo-gpu-a100"}


def test_a_placement_policy_the_magic_does_not_know_stops_the_configuration() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_config({**CONFIG, "offload": {"placementPolicy": "fastest"}}, "config.yaml")
    assert "config.yaml: offload.placementPolicy='fastest'" in str(err.value)
    assert "most-free, bin-pack, first-fit" in str(err.value)


def test_a_quota_left_from_an_earlier_configuration_is_brought_to_the_configured_share(
    drive: Callable[..., dict[str, Any]], api_client: Any
) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
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


QUEUED = {**CONFIG, "queueing": {"kueue": {"enabled": True, "localQueue": "gpus", "defaultPriority": "batch",
                                           "priorityClasses": [{"name": "interactive", "value": 1000},
                                                               {"name": "batch", "value": 100},
                                                               {"name": "urgent", "value": 5000, "users": ["kim"]}]}}}


@pytest.fixture(scope="module")
def drive_queued(origin: RunningOrigin, api_client: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., dict[str, Any]]]:
    """The hook with queueing through Kueue on, Kueue's CRDs installed as installing Kueue registers them, and
    removed afterwards as uninstalling it does: the origin is shared with modules that have no Kueue."""
    installed = install_crds(api_client, REPO / ".." / "shared" / "kueue-crds")
    try:
        yield _driver(origin, tmp_path_factory.mktemp("hubenv-queued"), QUEUED)
    finally:
        extensions = kubernetes.client.ApiextensionsV1Api(api_client)
        for name in installed:
            extensions.delete_custom_resource_definition(name)


def test_with_queueing_on_the_hook_makes_a_local_queue_and_no_gpu_quota(
    drive_queued: Callable[..., dict[str, Any]], api_client: Any
) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    ns = "jhub-kim"
    # a quota from before queueing was turned on would refuse queued pods at creation: it goes
    core.create_namespace({"metadata": {"name": ns, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpu-offload"},
                                               "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}})
    result = drive_queued(scenario="hook", user="kim")
    assert "error" not in result, result
    queue = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", ns, "localqueues", "gpus")
    # Kueue's CRD defaults stopPolicy to None (not stopped): an API server that applies CRD defaults shows it
    assert queue["spec"].pop("stopPolicy", "None") == "None", queue["spec"]
    assert queue["spec"] == {"clusterQueue": "gpu-offload"}
    # only the object counts stay: they cap no GPU, so a queued pod is counted like any object
    (left,) = core.list_namespaced_resource_quota(ns).items
    assert left.metadata.name == "gpu-offload-objects" and not any("gpu" in key for key in left.spec.hard)
    env = result["environment"]
    assert (env["GPU_OFFLOAD_QUEUE"], env["GPU_OFFLOAD_PRIORITY"]) == ("gpus", "batch")
    # the classes kim may name, for the chart's admission policy: urgent is kept for kim
    allowed = core.read_namespaced_config_map("gpu-offload-priority-classes", ns)
    assert sorted(allowed.data) == ["batch", "interactive", "urgent"]
    again = drive_queued(scenario="hook", user="kim")  # everything in place: the next spawn succeeds too
    assert "error" not in again, again
    lee = drive_queued(scenario="hook", user="lee")
    assert "error" not in lee, lee
    assert sorted(core.read_namespaced_config_map("gpu-offload-priority-classes", "jhub-lee").data) == [
        "batch", "interactive"]


# What Metaflow itself and @gpu_offload read, in a process given only the server's environment.
FLOW_READER = """
import json
from metaflow.metaflow_config import KUBERNETES_NAMESPACE
from metaflow.util import get_username
from gpu_offload.flows.live import target_namespace
from gpu_offload.flows.settings import metaflow_settings
settings = metaflow_settings()
print(json.dumps({"jobs_in": KUBERNETES_NAMESPACE, "steps_in": target_namespace(settings), "user": get_username(),
                  "source": settings.source, "queue": settings.queue, "priority": settings.priority}))
"""


def test_a_flow_run_from_the_users_server_goes_to_their_namespace_as_them_placed_from_configuration(
        drive_queued: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    """``python flow.py run`` in the user's server needs nothing set by hand: Metaflow's Jobs go to the user's
    namespace (the only one the server's account may create Jobs in), runs are recorded as the hub user (a
    server's container has no USER: Metaflow refuses to run, "Unknown user"), and placement comes from the
    configuration the spawner wrote, never from the cluster (the chart's user-server role reads no nodes)."""
    result = drive_queued(scenario="hook", user="mia")
    assert "error" not in result, result
    env = result["environment"]
    assert (env["METAFLOW_KUBERNETES_NAMESPACE"], env["METAFLOW_USER"], env["METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE"]
            ) == ("jhub-mia", "mia", "config")
    home = tmp_path / "home"
    home.mkdir()
    server = {"PATH": os.environ["PATH"], "HOME": str(home), **env}  # no USER, USERNAME or kubeconfig
    done = subprocess.run([sys.executable, "-c", FLOW_READER], env=server, cwd=home, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "jobs_in": "jhub-mia", "steps_in": "jhub-mia", "user": "mia", "source": "config", "queue": "gpus",
        "priority": "batch"}


def test_without_queueing_the_server_gets_no_queue() -> None:
    env = un.server_environment("jhub-alice", parse_config(CONFIG))
    assert "GPU_OFFLOAD_QUEUE" not in env and "GPU_OFFLOAD_PRIORITY" not in env


def test_bad_queueing_values_stop_the_configuration() -> None:
    with pytest.raises(InvalidRequest, match=r"config.yaml: queueing.kueue.defaultPriority='urgent' is not one"):
        parse_config({**CONFIG, "queueing": {"kueue": {"enabled": True, "defaultPriority": "urgent"}}}, "config.yaml")
    # off: the rest of the section is not read
    assert parse_config({**CONFIG, "queueing": {"kueue": {"enabled": False}}}).queueing is None


def test_a_user_namespace_holds_only_so_many_secrets_services_and_pods(origin: RunningOrigin, tmp_path: Path,
                                                                       api_client: Any) -> None:
    caps = {"pods": 2, "secrets": 2, "services": 1}
    config = {**CONFIG, "userNamespaces": {**CONFIG["userNamespaces"], "objectQuota": caps}}
    result = _driver(origin, tmp_path, config)(scenario="hook", user="flood")
    assert "error" not in result, result
    core = kubernetes.client.CoreV1Api(api_client)
    quota = core.read_namespaced_resource_quota("gpu-offload-objects", "jhub-flood")
    assert quota.spec.hard == {k: str(v) for k, v in caps.items()}
    for i in range(2):
        core.create_namespaced_secret("jhub-flood", {"metadata": {"name": f"s{i}"}})
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_secret("jhub-flood", {"metadata": {"name": "s2"}})
    assert refused.value.status == 403 and "exceeded quota: gpu-offload-objects" in refused.value.body
    headless = {"metadata": {"name": "svc0"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}
    core.create_namespaced_service("jhub-flood", headless)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_service("jhub-flood", {**headless, "metadata": {"name": "svc1"}})
    assert refused.value.status == 403 and "services=1" in refused.value.body
    # the chart's defaults cap every user namespace
    assert dict(parse_config({}).user_namespaces.object_quota) == {"pods": 50, "secrets": 100, "services": 20}
    with pytest.raises(InvalidRequest, match="objectQuota.pods=-1"):
        parse_config({"userNamespaces": {"objectQuota": {"pods": -1}}})


def test_a_user_namespace_an_earlier_version_offloaded_for_every_pod_keeps_pods_local_after_the_next_spawn(
        drive: Callable[..., dict[str, Any]], api_client: Any) -> None:
    core, custom = kubernetes.client.CoreV1Api(api_client), kubernetes.client.CustomObjectsApi(api_client)
    ns = "jhub-olga"
    core.create_namespace({"metadata": {"name": ns, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings", {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading", "metadata": {"name": "offloading"},
        "spec": {"podOffloadingStrategy": "LocalAndRemote"}})
    result = drive(scenario="hook", user="olga")
    assert "error" not in result, result
    offloading = custom.get_namespaced_custom_object("offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings",
                                                     "offloading")
    assert offloading["spec"]["podOffloadingStrategy"] == "Local"
    # Liqo's webhook then leaves pods alone: the namespace loses the label it selects on
    wait_until(lambda: "liqo.io/scheduling-enabled" not in (core.read_namespace(ns).metadata.labels or {}),
               "the scheduling label removed")


TRUSTED_ONLY = {**CONFIG, "offload": {**CONFIG["offload"], "gpuQuotaPerUser": 0, "trustedOnly": True}}


@pytest.fixture(scope="module")
def drive_trusted_only(origin: RunningOrigin, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """The hook with the chart's offload.trustedOnly on (donor-2 trusted, donor-1 not)."""
    return _driver(origin, tmp_path_factory.mktemp("hubenv-trusted"), TRUSTED_ONLY)


def _aimed_at(cluster: str) -> dict[str, Any]:
    """A pod a user's server could write itself, tolerating virtual nodes and naming one donor."""
    from gpu_offload.liqo_peering.placement import scheduling_fragment

    fragment = scheduling_fragment(cluster, 1)
    return {"metadata": {"name": f"aimed-at-{cluster}"},
            "spec": {"restartPolicy": "Never", "tolerations": fragment["tolerations"], "affinity": fragment["affinity"],
                     "containers": [{"name": "c", "image": "python:3.11", "resources": fragment["resources"],
                                     "command": ["python3", "-c", "import time; time.sleep(30)"]}]}}


def test_with_trusted_only_the_namespace_reaches_trusted_donors_only_whatever_a_pod_asks(
    drive_trusted_only: Callable[..., dict[str, Any]], api_client: Any
) -> None:
    from gpu_offload.sandbox.fixtures import wait_until

    core, custom = kubernetes.client.CoreV1Api(api_client), kubernetes.client.CustomObjectsApi(api_client)
    ns = "jhub-tess"
    # a namespace offloaded everywhere by a spawn from before trustedOnly was set: the next spawn narrows it
    core.create_namespace({"metadata": {"name": ns, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings",
                                           namespace_offloading(ns))
    result = drive_trusted_only(scenario="hook", user="tess")
    assert "error" not in result, result
    assert result["environment"]["GPU_OFFLOAD_TRUSTED_ONLY"] == "1"
    # the user lifts trusted-only in their kernel, or writes a pod aimed at the untrusted donor: it never runs
    # there. The namespace is offloaded with Local (Liqo's webhook leaves pods alone) to the trusted donor only, so
    # the untrusted donor's virtual kubelet holds no twin of it and marks the pod OffloadingBackOff (its fallback
    # reflector); the admission policy refuses such a pod from a user's server before that
    core.create_namespaced_pod(ns, _aimed_at("donor-1"))
    core.create_namespaced_pod(ns, _aimed_at("donor-2"))
    wait_until(lambda: core.read_namespaced_pod("aimed-at-donor-2", ns).status.phase == "Running",
               "the trusted donor's pod running")
    wait_until(lambda: core.read_namespaced_pod("aimed-at-donor-1", ns).status.reason == "OffloadingBackOff",
               "the untrusted donor's pod held back")
    held = core.read_namespaced_pod("aimed-at-donor-1", ns)
    assert held.status.phase == "Pending" and not held.status.container_statuses
    offloading = custom.get_namespaced_custom_object("offloading.liqo.io", "v1beta1", ns, "namespaceoffloadings",
                                                     "offloading")
    (term,) = offloading["spec"]["clusterSelector"]["nodeSelectorTerms"]
    assert {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-2"]} in term["matchExpressions"]
    core.delete_namespace(ns)


def test_with_trusted_only_and_no_trusted_donor_the_namespace_stays_local(
    origin: RunningOrigin, tmp_path_factory: pytest.TempPathFactory, api_client: Any
) -> None:
    config = {**TRUSTED_ONLY, "clusters": {"donor-1": {"gpuModel": "A100"}}}
    drive = _driver(origin, tmp_path_factory.mktemp("hubenv-none-trusted"), config)
    assert "error" not in drive(scenario="hook", user="uma")
    offloading = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", "jhub-uma", "namespaceoffloadings", "offloading")
    assert offloading["spec"]["podOffloadingStrategy"] == "Local"
    # and reaches no donor: Liqo creates the namespace on none, so it reflects nothing and runs none of its pods
    wait_until(lambda: kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", "jhub-uma", "namespaceoffloadings", "offloading").get("status", {}).get(
        "offloadingPhase") == "NoClusterSelected", "no cluster selected")
