"""helm/z2jh-overlay.yaml is valid zero-to-jupyterhub configuration and agrees with the gpu-offload chart.

The z2jh chart cannot be fetched here; its values.yaml and values.schema.yaml (data, in ../shared/z2jh/)
are enough to check an overlay the way `helm install` would: coalesce it over the defaults, then validate
against the schema.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from traitlets.config import Config


@pytest.fixture(scope="module")
def z2jh_schema(kit: Any) -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((kit.shared / "z2jh" / "values.schema.yaml").read_text())
    return schema


@pytest.fixture(scope="module")
def z2jh(
    kit: Any, z2jh_schema: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[helm.Chart]:
    """A stand-in z2jh chart (no templates) holding z2jh's real defaults and schema, so Helm itself merges.

    Built in a temporary directory: the z2jh data is read from ../shared, never copied into the repository.
    """
    chart_dir = tmp_path_factory.mktemp("z2jh") / "jupyterhub"
    chart_dir.mkdir()
    (chart_dir / "Chart.yaml").write_text("apiVersion: v2\nname: jupyterhub\nversion: 0.0.0-values-only\n")
    shutil.copyfile(kit.shared / "z2jh" / "values.yaml", chart_dir / "values.yaml")
    (chart_dir / "values.schema.json").write_text(json.dumps(z2jh_schema))
    with helm.Chart.load(chart_dir) as chart:
        yield chart


@pytest.fixture(scope="module")
def overlay(kit: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(kit.overlay.read_text())
    return loaded


def _schema_errors(schema: dict[str, Any], values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"/{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(values)]


def test_the_overlay_merged_over_z2jh_defaults_satisfies_z2jh_schema(
    z2jh: helm.Chart, z2jh_schema: dict[str, Any], overlay: dict[str, Any]
) -> None:
    merged = z2jh.merge_values(overlay)
    assert merged["hub"]["serviceAccount"]["name"] == "gpu-offload-hub"  # the overlay took effect
    assert merged["proxy"]["chp"]["networkPolicy"]["enabled"] is True  # the defaults survived
    assert _schema_errors(z2jh_schema, merged) == []
    z2jh.validate_schema(overlay)  # and Helm's own validator agrees


@pytest.mark.parametrize(
    "broken, where",
    [
        ({"singleuser": {"serviceAcountName": "gpu-offload-user-server"}}, "serviceAcountName"),
        ({"hub": {"service": {"extraPorts": {"gpu-offload": 10101}}}}, "extraPorts"),
        ({"hub": {"networkPolicy": {"interNamespaceAccessLabels": "allow"}}}, "allow"),
    ],
    ids=["misspelt key", "wrong type", "not an allowed value"],
)
def test_the_same_check_refuses_a_broken_overlay(
    z2jh: helm.Chart, z2jh_schema: dict[str, Any], overlay: dict[str, Any], broken: dict[str, Any], where: str
) -> None:
    merged = z2jh.merge_values(_deep_merge(overlay, broken))
    errors = _schema_errors(z2jh_schema, merged)
    assert errors and any(where in e for e in errors), errors


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def test_the_overlay_refers_to_what_the_chart_creates(kit: Any, overlay: dict[str, Any]) -> None:
    objects = kit.render(kit.two_tenants)
    config = kit.config_of(objects)
    hub = overlay["hub"]

    kit.find(objects, "ServiceAccount", hub["serviceAccount"]["name"], kit.hub_namespace)
    assert hub["serviceAccount"]["create"] is False
    volumes = {v["name"]: v for v in hub["extraVolumes"]}
    mounts = {m["name"]: m["mountPath"] for m in hub["extraVolumeMounts"]}
    configmap = kit.find(objects, "ConfigMap", volumes["gpu-offload-config"]["configMap"]["name"])
    claim = volumes["gpu-offload-usage-db"]["persistentVolumeClaim"]["claimName"]
    kit.find(objects, "PersistentVolumeClaim", claim)

    config_path = f"{mounts['gpu-offload-config']}/{next(iter(configmap['data']))}"
    assert hub["extraEnv"]["GPU_OFFLOAD_CONFIG"] == config_path
    assert hub["services"]["gpu-offload"]["environment"]["GPU_OFFLOAD_CONFIG"] == config_path
    assert config["usageDatabase"]["url"].startswith(f"sqlite:///{mounts['gpu-offload-usage-db']}/")

    assert overlay["singleuser"]["serviceAccountName"] == config["userNamespaces"]["userServerServiceAccount"]


def test_one_port_for_the_service_everywhere(kit: Any, overlay: dict[str, Any]) -> None:
    port = kit.config_of(kit.render())["service"]["port"]
    hub = overlay["hub"]
    assert hub["services"]["gpu-offload"]["url"] == f"http://hub:{port}"
    assert [(p["port"], p["targetPort"]) for p in hub["service"]["extraPorts"]] == [(port, port)]
    assert [p["port"] for rule in hub["networkPolicy"]["ingress"] for p in rule["ports"]] == [port]
    assert f"svc:{port}/services/gpu-offload/" in hub["extraConfig"]["gpu-offload"]


def test_the_service_entry_uses_only_fields_jupyterhub_knows(overlay: dict[str, Any]) -> None:
    """z2jh's schema does not look inside a service entry; JupyterHub refuses unknown fields at startup."""
    from jupyterhub.services.service import Service

    entry = overlay["hub"]["services"]["gpu-offload"]
    unknown = [key for key in entry if key not in Service.class_traits(input=True)]
    assert unknown == [], f"JupyterHub's Service has no field(s) {unknown}"
    assert isinstance(entry["command"], list) and entry["command"][:2] == ["python3", "-m"]
    for role in overlay["hub"]["loadRoles"].values():
        assert set(role) <= {"name", "description", "scopes", "users", "groups", "services"}, role


def test_the_roles_use_custom_scopes_that_the_hub_defines(overlay: dict[str, Any]) -> None:
    defined = set(overlay["hub"]["config"]["JupyterHub"]["custom_scopes"])
    roles = overlay["hub"]["loadRoles"]
    viewer = set(roles["gpu-offload-viewer"]["scopes"])
    operator = set(roles["gpu-offload-operator"]["scopes"])
    used = {s for s in viewer | operator if s.startswith("custom:")}
    assert used == defined == {"custom:gpu-offload:view", "custom:gpu-offload:manage"}
    assert "custom:gpu-offload:manage" not in viewer  # read and write stay separate
    assert viewer < operator
    # Tokens issued through the service's OAuth must be able to carry both, or role holders get 403.
    service = overlay["hub"]["services"]["gpu-offload"]
    assert set(service["oauth_client_allowed_scopes"]) == defined
    # Plain users are not granted access to the admin service, so JupyterHub does not list it to them.
    assert "extra_user_scopes" not in overlay["hub"]["config"]["JupyterHub"]


# Run in a child process: JupyterHub keeps scope definitions in a module-global registry.
_CHECK_SCOPES = """
import json, sys
from jupyterhub import scopes
overlay = json.load(sys.stdin)
jupyterhub = overlay["hub"]["config"]["JupyterHub"]
scopes.define_custom_scopes(jupyterhub["custom_scopes"])
for name, role in overlay["hub"]["loadRoles"].items():
    scopes._check_scopes_exist(role["scopes"], who_for=f"role {name}")
service = overlay["hub"]["services"]["gpu-offload"]
scopes._check_scopes_exist(service["oauth_client_allowed_scopes"], who_for="the service's OAuth client")
scopes._check_scopes_exist(overlay["hub"]["config"]["KubeSpawner"]["server_token_scopes"], who_for="server tokens")
"""


@pytest.mark.e2e  # starts a process
def test_jupyterhub_accepts_the_custom_scopes_and_every_scope_the_overlay_grants(
    overlay: dict[str, Any],
) -> None:
    checked = subprocess.run(
        [sys.executable, "-c", _CHECK_SCOPES],
        input=json.dumps(overlay),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr


@pytest.fixture
def spawner_module() -> types.ModuleType:
    """gpu_offload.hub_extension.spawner, whose two names the overlay's extraConfig imports."""
    from gpu_offload.hub_extension import spawner

    return spawner


def test_extra_config_runs_and_wires_the_hub(
    kit: Any, overlay: dict[str, Any], spawner_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {
        "POD_NAMESPACE": kit.hub_namespace,
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "HUB_SERVICE_PORT": "8081",
    }.items():
        monkeypatch.setenv(key, value)
    c = Config()
    # What z2jh's jupyterhub_config.py has set by the time extraConfig runs.
    c.JupyterHub.services = [{"name": name, **spec} for name, spec in overlay["hub"]["services"].items()]
    c.KubeSpawner.environment = dict(overlay["singleuser"]["extraEnv"])

    code = compile(overlay["hub"]["extraConfig"]["gpu-offload"], "hub.extraConfig.gpu-offload", "exec")
    exec(code, {"c": c})

    config = kit.config_of(kit.render())
    spawner = c.KubeSpawner
    assert spawner.enable_user_namespaces is True
    assert spawner.pre_spawn_hook is spawner_module.pre_spawn_hook
    assert spawner.profile_list is spawner_module.profile_list
    # the namespaces kubespawner creates are the ones the chart's admission policy admits
    alice = spawner.user_namespace_template.format(hubnamespace=kit.hub_namespace, username="alice")
    assert alice.startswith(config["userNamespaces"]["prefix"])
    assert spawner.user_namespace_labels[config["userNamespaces"]["label"]] == "true"
    assert spawner.user_namespace_labels["hub.jupyter.org/network-access-hub"] == "true"

    assert c.JupyterHub.hub_connect_url == "http://hub.jhub.svc:8081"
    assert spawner.environment["GPU_OFFLOAD_SERVICE_URL"] == "http://hub.jhub.svc:10101/services/gpu-offload/"
    assert spawner.environment["GPU_OFFLOAD_BACKEND"] == "kubernetes"
    service_env = c.JupyterHub.services[0]["environment"]
    assert (
        service_env["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"
        and service_env["KUBERNETES_SERVICE_PORT"] == "443"
    )


def _user_server_pod(overlay: dict[str, Any], merged: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The user server pod kubespawner's ``make_pod`` builds from the overlay's extraConfig and the singleuser
    values z2jh's jupyterhub_config.py passes on (uid, fsGid, allowPrivilegeEscalation, and with
    cloudMetadata.blockWithIptables its privileged iptables init container)."""
    from kubernetes.client import ApiClient
    from kubespawner.objects import make_pod

    monkeypatch.setenv("POD_NAMESPACE", "jhub")
    c = Config()
    c.JupyterHub.services = []
    exec(compile(overlay["hub"]["extraConfig"]["gpu-offload"], "extraConfig", "exec"), {"c": c})
    single = merged["singleuser"]
    init = []
    if single["cloudMetadata"]["blockWithIptables"]:
        init = [{"name": "block-cloud-metadata", "image": "quay.io/jupyterhub/k8s-network-tools:4.0.0",
                 "command": ["iptables", "--append", "OUTPUT", "--destination", single["cloudMetadata"]["ip"],
                             "--jump", "DROP"],
                 "securityContext": {"privileged": True, "runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}]
    pod = make_pod(
        name="jupyter-alice", cmd=["jupyterhub-singleuser"], port=8888,
        image=f"{single['image']['name']}:{single['image']['tag']}", uid=single["uid"], fs_gid=single["fsGid"],
        allow_privilege_escalation=single["allowPrivilegeEscalation"],
        container_security_context=c.KubeSpawner.container_security_context,
        pod_security_context=c.KubeSpawner.pod_security_context, init_containers=init,
    )
    serialized: dict[str, Any] = ApiClient().sanitize_for_serialization(pod)
    return serialized


def test_the_overlays_user_server_meets_the_restricted_pod_security_level(
    z2jh: helm.Chart, overlay: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_offload.sandbox.podsecurity import violations

    merged = z2jh.merge_values(overlay)
    assert merged["singleuser"]["cloudMetadata"]["blockWithIptables"] is False
    pod = _user_server_pod(overlay, merged, monkeypatch)
    assert violations(pod["spec"], "restricted") == []
    # z2jh's default (the iptables init container) would not even meet baseline
    blocking = z2jh.merge_values(_deep_merge(overlay, {"singleuser": {"cloudMetadata": {"blockWithIptables": True}}}))
    found = [v.reason for v in violations(_user_server_pod(overlay, blocking, monkeypatch)["spec"], "baseline")]
    assert found == ["non-default capabilities", "privileged"]
