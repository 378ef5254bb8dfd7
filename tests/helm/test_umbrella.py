"""The chart is one release of JupyterHub with gpu-offload: zero-to-jupyterhub's chart (../shared/z2jh-chart, placed
as the dependency) and the project's objects, rendered together under two release names.

Every rendered object validates against the Kubernetes schemas (strict, none skipped), no two releases share a
name, and zero-to-jupyterhub's own hub configuration (its jupyterhub_config.py and z2jh.py, run on the rendered
Secret and ConfigMap with this release's gpu-offload ConfigMap served by the sandbox's API server) ends up with
the project's service, spawner hook, profiles and settings.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

# Two releases as an admin would install them: the plain one, and a second team's in its own namespace with
# settings of its own (and zero-to-jupyterhub's names following the release too).
RELEASES: dict[str, dict[str, Any]] = {
    "gpu-offload": {"namespace": "jhub", "values": {}},
    "team-b": {
        "namespace": "research",
        "values": {
            "jupyterhub": {"fullnameOverride": None},
            "userNamespaces": {"prefix": "team-b-"},
            "offload": {"defaultImage": "registry.example/python:3.12", "gpuQuotaPerUser": 2},
            "clusters": {"donor-1": {"trusted": True, "gpuModel": "A100", "pricePerGpuHour": 2.5}},
        },
    },
}


def _render(kit: Any, release: str, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    spec = RELEASES[release]
    values = json.loads(json.dumps(spec["values"]))
    for key, value in (extra or {}).items():
        values[key] = {**values.get(key, {}), **value}
    objects: list[dict[str, Any]] = kit.objects(values, name=release, namespace=spec["namespace"])
    return objects


def _crd_schemas(shared: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) -> openAPIV3Schema of every Liqo and Kueue CRD in ../shared."""
    schemas = {}
    for folder in ("liqo-crds", "kueue-crds"):
        for path in sorted((shared / folder).glob("*.yaml")):
            for crd in yaml.safe_load_all(path.read_text()):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                for version in crd["spec"]["versions"]:
                    key = (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"])
                    schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def _validate(obj: dict[str, Any], kube_version: str, crds: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    import jsonschema

    group, _, version = obj["apiVersion"].rpartition("/")
    schema = crds.get((group, version, obj["kind"]))
    if schema is not None:
        jsonschema.validate(obj, schema)
        return
    # validate() raises SchemaNotFoundError for a kind it has no schema for (a custom resource): letting it
    # propagate is what guarantees nothing was skipped.
    try:
        kubernetes_validate.validate(obj, kube_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} is invalid at {where}: {error.message}")


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_object_of_the_release_validates(kit: Any, release: str) -> None:
    crds = _crd_schemas(kit.shared)
    objects = _render(kit, release, {"queueing": {"kueue": {"enabled": True}}})
    kinds = {o["kind"] for o in objects}
    # zero-to-jupyterhub's hub and proxy, and the project's configuration, RBAC and policies, in one render
    assert {"Deployment", "Secret", "Service", "ConfigMap", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds
    for obj in objects:
        _validate(obj, kit.kube_version, crds)


def test_two_releases_share_no_cluster_scoped_name(kit: Any) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding", "PriorityClass"}
    first, second = ({(o["kind"], o["metadata"]["name"]) for o in _render(kit, release)
                      if o["kind"] in cluster_scoped} for release in sorted(RELEASES))
    assert first and second
    assert first & second == set()


def test_two_releases_in_one_namespace_share_no_name(kit: Any) -> None:
    """With zero-to-jupyterhub's fullnameOverride null (in the admin's values file), nothing collides."""
    renders = [kit.objects({"jupyterhub": {"fullnameOverride": None}, "userNamespaces": {"prefix": f"{r}-"}},
                           name=r, namespace="jhub") for r in ("lab-a", "lab-b")]
    first, second = ({(o["kind"], o["metadata"]["name"]) for o in objects} for objects in renders)
    assert len(first) == len(renders[0]), "one release renders a name twice"
    assert first & second == set()


def test_the_hubs_account_is_bound_and_is_the_one_its_pod_runs_as(kit: Any) -> None:
    for release, spec in RELEASES.items():
        objects = _render(kit, release)
        hub = next(o for o in objects if o["kind"] == "Deployment"
                   and o["spec"]["template"]["metadata"]["labels"].get("component") == "hub")
        account = hub["spec"]["template"]["spec"]["serviceAccountName"]
        bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
                    and o["metadata"]["name"].startswith(kit.find(objects, "ConfigMap", _config_map(release))
                                                         ["metadata"]["name"].removesuffix("-config"))]
        hub_subjects = [s for b in bindings for s in b.get("subjects", []) if s["name"] == account]
        assert hub_subjects and all(s["namespace"] == spec["namespace"] for s in hub_subjects), release
        config = yaml.safe_load(kit.find(objects, "ConfigMap", _config_map(release))["data"]["config.yaml"])
        assert config["hubServiceAccount"] == account


def _config_map(release: str) -> str:
    from gpu_offload.hub_extension.spawner.chart_hub import release_fullname

    return f"{release_fullname(release)}-config"


# --- the hub's configuration, as zero-to-jupyterhub's own jupyterhub_config.py builds it ---------------------

_Z2JH_ROOT = "/usr/local/etc/jupyterhub"

_RUN_HUB_CONFIG = r"""
import json, os, stat, sys
from traitlets.config import Config

root = sys.argv[1]
c = Config()
path = os.path.join(root, "jupyterhub_config.py")
exec(compile(open(path).read(), path, "exec"), {"get_config": lambda: c, "__file__": path, "__name__": "config"})

from gpu_offload.hub_extension.config import load_config

spawner = c.KubeSpawner
config_path = os.environ["GPU_OFFLOAD_CONFIG"]
hub = load_config()
print(json.dumps({
    "enable_user_namespaces": spawner.enable_user_namespaces,
    "user_namespace_template": spawner.user_namespace_template,
    "user_namespace_labels": spawner.user_namespace_labels,
    "pre_spawn_hook": f"{spawner.pre_spawn_hook.__module__}.{spawner.pre_spawn_hook.__name__}",
    "profile_list": f"{spawner.profile_list.__module__}.{spawner.profile_list.__name__}",
    "environment": {k: v for k, v in spawner.environment.items() if isinstance(v, str)},
    "namespace": spawner.namespace,
    "hub_connect_url": c.JupyterHub.hub_connect_url,
    "services": c.JupyterHub.services,
    "config_path": config_path,
    "config_mode": stat.S_IMODE(os.stat(config_path).st_mode),
    "hub": {"namespace": hub.hub_namespace, "account": hub.hub_service_account,
            "hub_role": hub.user_namespaces.hub_cluster_role, "prefix": hub.user_namespace_prefix,
            "image": hub.default_image, "quota": hub.gpu_quota_per_user,
            "trusted": list(hub.clusters.trusted_ids), "database": hub.database_url},
}, default=str))
"""


def _hub_files(objects: list[dict[str, Any]], z2jh_files: Path, root: Path) -> None:
    """The hub pod's /usr/local/etc/jupyterhub, under ``root``: z2jh's two files (their fixed paths moved to
    ``root``, nothing else changed) and the rendered hub ConfigMap and Secret as Kubernetes mounts them."""
    for name in ("jupyterhub_config.py", "z2jh.py"):
        (root / name).write_text((z2jh_files / name).read_text().replace(_Z2JH_ROOT, str(root)))
    hub_config = next(o for o in objects if o["kind"] == "ConfigMap" and "z2jh.py" in o.get("data", {}))
    hub_secret = next(o for o in objects if o["kind"] == "Secret" and "values.yaml" in o.get("data", {}))
    (root / "config").mkdir()
    for key, value in hub_config["data"].items():
        (root / "config" / key).write_text(value)
    (root / "secret").mkdir()
    for key, value in hub_secret["data"].items():
        (root / "secret" / key).write_bytes(base64.b64decode(value))
    for key, value in (hub_secret.get("stringData") or {}).items():
        (root / "secret" / key).write_text(value)


def _service_environment(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The <NAME>_SERVICE_HOST/_PORT variables the kubelet sets for every Service of the namespace."""
    env = {}
    for index, service in enumerate(o for o in objects if o["kind"] == "Service"):
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        env[f"{prefix}_SERVICE_HOST"] = f"10.96.0.{index + 10}"
        env[f"{prefix}_SERVICE_PORT"] = str(service["spec"]["ports"][0]["port"])
    return env


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from gpu_offload.sandbox.testing import running_sandbox

    with running_sandbox(tmp_path_factory.mktemp("api")) as running:
        yield running


def _serve(sandbox: Any, namespace: str, config_map: dict[str, Any]) -> None:
    from kubernetes.client import CoreV1Api

    core = CoreV1Api(sandbox.api_client())
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_config_map(namespace, {**config_map, "metadata": {
        **config_map["metadata"], "namespace": namespace}})


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_zero_to_jupyterhubs_hub_configuration_picks_up_the_projects_settings(
    kit: Any, sandbox: Any, tmp_path: Path, release: str
) -> None:
    spec = RELEASES[release]
    namespace = spec["namespace"]
    objects = _render(kit, release)
    ours = kit.find(objects, "ConfigMap", _config_map(release))
    _serve(sandbox, namespace, ours)
    root = tmp_path / "jupyterhub"
    root.mkdir()
    _hub_files(objects, kit.shared / "z2jh-chart" / "jupyterhub" / "files" / "hub", root)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(sandbox.kubeconfig),
           "POD_NAMESPACE": namespace, "TMPDIR": str(tmp_path), **_service_environment(objects)}
    ran = subprocess.run([sys.executable, "-c", _RUN_HUB_CONFIG, str(root)], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    hub = json.loads(ran.stdout.strip().splitlines()[-1])

    hub_service = next(o for o in objects if o["kind"] == "Service"
                       and o["spec"]["selector"].get("component") == "hub")["metadata"]["name"]
    values = spec["values"]
    prefix = values.get("userNamespaces", {}).get("prefix") or f"{namespace}-"
    assert hub["enable_user_namespaces"] is True and hub["namespace"] == namespace
    assert hub["user_namespace_template"] == prefix + "{username}"
    assert hub["user_namespace_labels"]["gpu-offload.io/user-namespace"] == "true"
    # kubespawner's own create of the namespace must pass the admission policy too (it is judged before the
    # API server answers that the namespace exists)
    assert hub["user_namespace_labels"]["pod-security.kubernetes.io/enforce"] == (
        values.get("userNamespaces", {}).get("podSecurity") or "baseline")
    assert hub["pre_spawn_hook"] == "gpu_offload.hub_extension.spawner.hooks.pre_spawn_hook"
    assert hub["profile_list"] == "gpu_offload.hub_extension.spawner.hooks.profile_list"
    assert hub["hub_connect_url"] == f"http://{hub_service}.{namespace}.svc:8081"
    # users' servers: the service's address, and the chart's singleuser.extraEnv kept
    assert hub["environment"]["GPU_OFFLOAD_SERVICE_URL"] == (
        f"http://{hub_service}.{namespace}.svc:10101/services/gpu-offload/")
    assert hub["environment"]["GPU_OFFLOAD_BACKEND"] == "kubernetes"
    (service,) = [s for s in hub["services"] if s["name"] == "gpu-offload"]
    assert service["url"] == f"http://{hub_service}:10101"
    assert service["command"] == ["python3", "-m", "gpu_offload.hub_extension.service.app"]
    assert service["environment"]["GPU_OFFLOAD_CONFIG"] == hub["config_path"]
    assert service["api_token"]  # z2jh generated it into its Secret
    assert hub["config_mode"] == 0o600

    # the settings of the values file, through the release's ConfigMap, in what the hook and service read
    rendered = yaml.safe_load(ours["data"]["config.yaml"])
    assert hub["hub"]["namespace"] == namespace and hub["hub"]["prefix"] == prefix
    assert hub["hub"]["account"] == rendered["hubServiceAccount"]
    kit.find(objects, "ClusterRole", hub["hub"]["hub_role"])
    assert hub["hub"]["image"] == values.get("offload", {}).get("defaultImage", "")  # empty: each kernel picks
    assert hub["hub"]["quota"] == values.get("offload", {}).get("gpuQuotaPerUser", 0)
    assert hub["hub"]["trusted"] == sorted(k for k, v in values.get("clusters", {}).items() if v.get("trusted"))
    assert hub["hub"]["database"] == "sqlite:////srv/jupyterhub/gpu-offload-usage.sqlite"


def test_without_its_configmap_the_hub_stops_naming_the_object_and_the_role(sandbox: Any) -> None:
    from gpu_offload.hub_extension.spawner.chart_hub import wire_hub
    from gpu_offload.liqo_peering.errors import GpuOffloadError
    from traitlets.config import Config

    environ = {"POD_NAMESPACE": "empty"}
    names = {"hub": "hub"}
    with pytest.raises(GpuOffloadError, match=r"ConfigMap empty/lab-gpu-offload-config \(HTTP 404.*"
                                              r"Role lab-gpu-offload-hub-config"):
        wire_hub(Config(), {"Release.Name": "lab"}.get, names.__getitem__, lambda name, suffix: "8081",
                 environ=environ, api_client=sandbox.api_client())
    assert "GPU_OFFLOAD_CONFIG" not in environ


# --- zero-to-jupyterhub values JupyterHub itself checks ----------------------------------------------------

def _hub_values(kit: Any) -> dict[str, Any]:
    merged: dict[str, Any] = kit.chart.merge_values(None)["jupyterhub"]
    return merged


def test_the_service_entry_uses_only_fields_jupyterhub_knows(kit: Any) -> None:
    """z2jh's schema does not look inside a service entry; JupyterHub refuses unknown fields at startup."""
    from jupyterhub.services.service import Service

    hub = _hub_values(kit)["hub"]
    entry = hub["services"]["gpu-offload"]
    unknown = [key for key in entry if key not in Service.class_traits(input=True)]
    assert unknown == [], f"JupyterHub's Service has no field(s) {unknown}"
    for role in hub["loadRoles"].values():
        assert set(role) <= {"name", "description", "scopes", "users", "groups", "services"}, role


# Run in a child process: JupyterHub keeps scope definitions in a module-global registry.
_CHECK_SCOPES = """
import json, sys
from jupyterhub import scopes
hub = json.load(sys.stdin)["hub"]
scopes.define_custom_scopes(hub["config"]["JupyterHub"]["custom_scopes"])
for name, role in hub["loadRoles"].items():
    scopes._check_scopes_exist(role["scopes"], who_for=f"role {name}")
service = hub["services"]["gpu-offload"]
scopes._check_scopes_exist(service["oauth_client_allowed_scopes"], who_for="the service's OAuth client")
scopes._check_scopes_exist(hub["config"]["KubeSpawner"]["server_token_scopes"], who_for="server tokens")
"""


@pytest.mark.e2e  # starts a process
def test_jupyterhub_accepts_the_custom_scopes_and_every_scope_the_chart_grants(kit: Any) -> None:
    hub_values = _hub_values(kit)
    hub = hub_values["hub"]
    defined = set(hub["config"]["JupyterHub"]["custom_scopes"])
    viewer = set(hub["loadRoles"]["gpu-offload-viewer"]["scopes"])
    operator = set(hub["loadRoles"]["gpu-offload-operator"]["scopes"])
    assert {s for s in viewer | operator if s.startswith("custom:")} == defined
    assert "custom:gpu-offload:manage" not in viewer and viewer < operator  # read and write stay separate
    assert set(hub["services"]["gpu-offload"]["oauth_client_allowed_scopes"]) == defined
    assert "extra_user_scopes" not in hub["config"]["JupyterHub"]  # the admin service is not listed to all
    checked = subprocess.run([sys.executable, "-c", _CHECK_SCOPES], input=json.dumps(hub_values),
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr


def _user_server_pod(single: dict[str, Any], init: list[dict[str, Any]]) -> dict[str, Any]:
    """The user server pod kubespawner's ``make_pod`` builds from the hub wiring's security contexts and the
    singleuser values z2jh passes on (uid, fsGid, allowPrivilegeEscalation)."""
    from gpu_offload.hub_extension.config import HubConfig
    from gpu_offload.hub_extension.spawner.chart_hub import ReleaseNames, apply
    from kubernetes.client import ApiClient
    from kubespawner.objects import make_pod
    from traitlets.config import Config

    c = Config()
    c.JupyterHub.services = [{"name": "gpu-offload"}]
    apply(c, ReleaseNames("jhub", "gpu-offload", "hub", "8081"), HubConfig(hub_namespace="jhub"),
          Path("/nonexistent/config.yaml"), {})
    pod = make_pod(
        name="jupyter-alice", cmd=["jupyterhub-singleuser"], port=8888,
        image=f"{single['image']['name']}:{single['image']['tag']}", uid=single["uid"], fs_gid=single["fsGid"],
        allow_privilege_escalation=single["allowPrivilegeEscalation"],
        container_security_context=c.KubeSpawner.container_security_context,
        pod_security_context=c.KubeSpawner.pod_security_context, init_containers=init,
    )
    serialized: dict[str, Any] = ApiClient().sanitize_for_serialization(pod)
    return serialized


def test_the_users_server_meets_the_restricted_pod_security_level(kit: Any) -> None:
    from gpu_offload.sandbox.apiserver.podsecurity import violations

    single = _hub_values(kit)["singleuser"]
    assert single["cloudMetadata"]["blockWithIptables"] is False
    assert violations(_user_server_pod(single, [])["spec"], "restricted") == []
    # z2jh's default (its privileged iptables init container) would not even meet baseline
    iptables = [{"name": "block-cloud-metadata", "image": "quay.io/jupyterhub/k8s-network-tools:4.0.0",
                 "command": ["iptables", "--append", "OUTPUT", "--destination", single["cloudMetadata"]["ip"],
                             "--jump", "DROP"],
                 "securityContext": {"privileged": True, "runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}]
    found = [v.reason for v in violations(_user_server_pod(single, iptables)["spec"], "baseline")]
    assert found == ["non-default capabilities", "privileged"]
