"""The chart lints clean, renders through Helm's Go SDK, and every object it renders is valid Kubernetes.

These tests look at the chart's own templates (kit.render leaves zero-to-jupyterhub's objects out);
test_umbrella.py renders both together."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

# Every combination an operator is told about in values.yaml.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "two tenants": {"liqo": {"tenantNamespaces": ["liqo-tenant-alpha", "liqo-tenant-beta"]}},
    "external database": {
        "usageDatabase": {"url": "postgresql://usage@db:5432/usage"},
        "jupyterhub": {"hub": {"db": {"type": "postgres", "url": "postgresql://hub@db:5432/hub"}}},
    },
    "a named hub account": {"jupyterhub": {"hub": {"serviceAccount": {"name": "jupyterhub"}}}},
    "no admission policy": {"admissionPolicy": {"enabled": False}},
    "queueing through Kueue": {"queueing": {"kueue": {"enabled": True, "clusterQueue": "pool", "priorityClasses": [
        {"name": "urgent", "value": 5000}, {"name": "interactive", "value": 1000}]}}},
    "prefix": {"userNamespaces": {"prefix": "jupyter-"}},
}


def test_lint_reports_no_warning_or_error(kit: Any) -> None:
    for values in VARIANTS.values():
        report = helm.lint(
            kit.chart_dir,
            values,
            strict=True,
            namespace=kit.hub_namespace,
            kube_version=f"v{kit.kube_version}",
        )
        serious = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and serious == [], (values, report)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_validates_against_the_pinned_kubernetes_schema(kit: Any, variant: str) -> None:
    objects = kit.render(VARIANTS[variant])
    assert objects
    for obj in objects:
        # validate() raises SchemaNotFoundError for a kind it has no schema for (the CLI only warns and
        # skips): letting that propagate is what guarantees nothing was skipped.
        try:
            kubernetes_validate.validate(obj, kit.kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} is invalid at {where}: {error.message}")


def test_the_default_render_holds_exactly_the_expected_kinds(kit: Any) -> None:
    kinds = sorted(o["kind"] for o in kit.render(kit.two_tenants))
    assert kinds == sorted(
        ["ConfigMap"]
        + ["ClusterRole"] * 4
        + ["ClusterRoleBinding"] * 2
        # the hub reads its ConfigMap; it writes ResourceSlices and labels in the two tenant namespaces
        + ["Role", "RoleBinding"] * 3
        # the hub's namespaces and bindings, user namespaces' labels, what users' servers may create
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 3
    )


def test_a_kind_without_a_schema_is_not_silently_accepted(kit: Any) -> None:
    """The guard above is real: a custom resource (no built-in schema) raises instead of passing."""
    offloading = {
        "apiVersion": "offloading.liqo.io/v1beta1",
        "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading", "namespace": "jhub-alice"},
        "spec": {},
    }
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(offloading, kit.kube_version, strict=True)


def test_namespaced_objects_land_in_the_release_namespace_or_a_tenant_namespace(kit: Any) -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj in kit.render(kit.two_tenants):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, obj["metadata"]
        elif obj["kind"] in {"Role", "RoleBinding"} and not obj["metadata"]["name"].endswith("-hub-config"):
            assert namespace in kit.two_tenants["liqo"]["tenantNamespaces"], obj["metadata"]
        else:
            assert namespace == kit.hub_namespace, obj["metadata"]


def test_the_usage_database_sits_on_the_hubs_volume_unless_a_url_is_set(kit: Any) -> None:
    # zero-to-jupyterhub mounts its hub database claim at /srv/jupyterhub (hub.db.type sqlite-pvc, its default)
    assert kit.config_of(kit.render())["usageDatabase"]["url"] == "sqlite:////srv/jupyterhub/gpu-offload-usage.sqlite"
    external = kit.render(VARIANTS["external database"])
    assert kit.config_of(external)["usageDatabase"]["url"] == "postgresql://usage@db:5432/usage"


def test_the_hub_account_is_zero_to_jupyterhubs(kit: Any) -> None:
    for values, account in (({}, "hub"), (VARIANTS["a named hub account"], "jupyterhub")):
        ours = kit.render(values)
        assert not [o for o in ours if o["kind"] == "ServiceAccount"]
        hub_sa = [o for o in kit.objects(values) if o["kind"] == "ServiceAccount"
                  and o["metadata"]["name"] == account]
        assert len(hub_sa) == 1, "zero-to-jupyterhub creates the account the chart's bindings name"
        for binding in (o for o in ours if o["kind"].endswith("Binding") and "subjects" in o
                        and not o["metadata"]["name"].endswith("user-server")):
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account, "namespace": kit.hub_namespace}
            ], binding["metadata"]["name"]
        assert kit.config_of(ours)["hubServiceAccount"] == account


def test_the_config_names_every_object_the_spawner_hook_must_bind(kit: Any) -> None:
    objects = kit.render(kit.two_tenants)
    config = kit.config_of(objects)
    assert config["hubNamespace"] == kit.hub_namespace
    kit.find(kit.objects(kit.two_tenants), "ServiceAccount", config["hubServiceAccount"])
    kit.find(objects, "ClusterRole", config["userNamespaces"]["hubClusterRole"])
    kit.find(objects, "ClusterRole", config["userNamespaces"]["userServerClusterRole"])
    assert config["userNamespaces"]["prefix"] == f"{kit.hub_namespace}-"
    assert config["userNamespaces"]["label"] == "gpu-offload.io/user-namespace"
    assert config["liqo"]["tenantNamespaces"] == ["liqo-tenant-alpha", "liqo-tenant-beta"]
    assert config["peering"]["liqoctlEnabled"] is False


def test_the_admins_cluster_trust_reaches_the_hub_through_the_configmap(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.liqo_peering.trust import ClusterPolicy

    clusters = {"donor-1": {"trusted": True, "gpuModel": "A100", "pricePerGpuHour": 2.5}, "donor-2": {}}
    config = parse_config(kit.config_of(kit.render({"clusters": clusters, "userNamespaces": {
        "podSecurity": "restricted"}})))
    assert config.clusters.clusters == {"donor-1": ClusterPolicy(True, "A100", 2.5), "donor-2": ClusterPolicy()}
    assert config.user_namespaces.pod_security == "restricted"
    default = parse_config(kit.config_of(kit.render()))
    assert default.clusters.trusted_ids == () and default.user_namespaces.pod_security == "baseline"


def test_the_queueing_values_reach_the_hub_through_the_configmap(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.liqo_peering.kueue import PriorityClass

    config = parse_config(kit.config_of(kit.render(VARIANTS["queueing through Kueue"])))
    assert config.queueing is not None
    assert (config.queueing.cluster_queue, config.queueing.local_queue) == ("pool", "gpu-offload")
    # the chart protects sessions by default, so the hub adds their class one above the admin's highest
    assert config.queueing.priority_classes == (PriorityClass("urgent", 5000), PriorityClass("interactive", 1000),
                                                PriorityClass("session-protected", 5001, PROTECTED_WORDS))
    assert config.queueing.default_priority == "interactive"
    default = parse_config(kit.config_of(kit.render()))
    assert default.queueing is None  # off unless the admin turns it on (Kueue is installed separately)
    chart_defaults = parse_config(kit.config_of(kit.render({"queueing": {"kueue": {"enabled": True}}})))
    assert chart_defaults.queueing is not None
    assert [(c.name, c.value) for c in chart_defaults.queueing.priority_classes] == [
        ("interactive", 1000), ("batch", 100), ("session-protected", 1001)]


def test_another_release_name_prefixes_every_object(kit: Any) -> None:
    objects = kit.render(kit.two_tenants, name="lab")
    names = {o["metadata"]["name"] for o in objects}
    assert all(name.startswith("lab-gpu-offload-") for name in names), names


def test_notes_tell_the_next_step_and_warn_about_what_is_missing(kit: Any) -> None:
    notes = kit.manifests()["gpu-offload/templates/NOTES.txt"]
    assert "the ConfigMap gpu-offload-config" in notes and "rollout restart deployment/hub" in notes
    assert "liqo.tenantNamespaces is empty" in notes

    other = kit.manifests({**kit.two_tenants, "admissionPolicy": {"enabled": False}}, name="lab")[
        "gpu-offload/templates/NOTES.txt"
    ]
    assert "the ConfigMap lab-gpu-offload-config" in other
    assert "liqo-tenant-alpha, liqo-tenant-beta" in other
    assert "admissionPolicy.enabled is false" in other


def test_strict_validation_catches_a_misspelt_field_in_a_rendered_rbac_object(kit: Any) -> None:
    """Strict mode is on: an unknown field (what a template typo produces) fails, it is not ignored."""
    role = kit.find(kit.render(), "ClusterRole", "gpu-offload-user-server")
    role["rules"][0]["verb"] = role["rules"][0].pop("verbs")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(role, kit.kube_version, strict=True)


def test_the_service_monitor_is_rendered_only_when_enabled_and_scrapes_with_the_token(kit: Any) -> None:
    assert not [o for o in kit.render(kit.two_tenants) if o["kind"] == "ServiceMonitor"]
    assert kit.config_of(kit.render(kit.two_tenants))["metrics"] == {"open": False, "perUserSeries": True}
    values = {"metrics": {"serviceMonitor": {"enabled": True, "tokenSecret": {"name": "prometheus-hub-token"},
                                             "labels": {"release": "prometheus"}}}}
    report = helm.lint(kit.chart_dir, values, strict=True, namespace=kit.hub_namespace,
                       kube_version=f"v{kit.kube_version}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    objects = kit.render(values)
    monitor = kit.find(objects, "ServiceMonitor", kit.release, kit.hub_namespace)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # this release's hub Service (zero-to-jupyterhub's labels), through the port the chart adds for the service
    assert monitor["spec"]["selector"] == {"matchLabels": {"component": "hub", "release": kit.release}}
    hub_service = kit.find(kit.objects(values), "Service", "hub")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= hub_service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("gpu-offload", "/services/gpu-offload/metrics")
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": "prometheus-hub-token", "key": "token"}}
    ports = hub_service["spec"]["ports"]
    assert {"name": "gpu-offload", "port": 10101} in [{k: p[k] for k in ("name", "port")} for p in ports]
    opened = kit.render({"metrics": {"open": True, "serviceMonitor": {"enabled": True}}})
    (endpoint,) = kit.find(opened, "ServiceMonitor", kit.release)["spec"]["endpoints"]
    assert "authorization" not in endpoint
    assert kit.config_of(opened)["metrics"] == {"open": True, "perUserSeries": True}


def test_the_charts_trusted_only_reaches_every_users_kernel(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.hub_extension.spawner.user_namespace import server_environment

    default = parse_config(kit.config_of(kit.render()))
    assert "GPU_OFFLOAD_TRUSTED_ONLY" not in server_environment("jhub-alice", default)
    chosen = parse_config(kit.config_of(kit.render({"offload": {"trustedOnly": True}})))
    assert server_environment("jhub-alice", chosen)["GPU_OFFLOAD_TRUSTED_ONLY"] == "1"


def test_the_grafana_dashboard_is_off_by_default_and_queries_only_metrics_the_service_serves(kit: Any) -> None:
    import json
    import re

    from gpu_offload.hub_extension.service.metrics import HubMetrics
    from gpu_offload.liqo_peering.inventory import Inventory
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    assert not [o for o in kit.render(kit.two_tenants) if o["kind"] == "ConfigMap"
                and "grafana_dashboard" in (o["metadata"].get("labels") or {})]
    values = {"metrics": {"grafanaDashboard": {"enabled": True}}}
    report = helm.lint(kit.chart_dir, values, strict=True, namespace=kit.hub_namespace,
                       kube_version=f"v{kit.kube_version}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    config_map = kit.find(kit.render(values), "ConfigMap", f"{kit.release}-dashboard", kit.hub_namespace)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar selects by
    kubernetes_validate.validate(config_map, kit.kube_version, strict=True)
    dashboard = json.loads(config_map["data"]["gpu-offload.json"])
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for q in queries for name in re.findall(r"\bgpu_offload_\w+", q)}
    # what /metrics serves: the service's own registry, exposed as its handler exposes it
    served: set[str] = set()
    for family in text_string_to_metric_families(generate_latest(HubMetrics(lambda: Inventory(())).registry)
                                                 .decode()):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
        served |= {family.name + s for s in suffixes.get(family.type, ("",))}
    assert used and used <= served, sorted(used - served)
    # and every family the service serves is charted somewhere
    families = {f.name for f in HubMetrics(lambda: Inventory(())).registry.collect()}
    assert {f for f in families if not any(name.startswith(f) for name in used)} == set()

def test_the_charts_monthly_budget_reaches_every_users_kernel(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.hub_extension.spawner.user_namespace import server_environment
    from gpu_offload.liqo_peering import environment as E

    from gpu_offload.engine.backends.kube.config import from_environment

    default = parse_config(kit.config_of(kit.render()))
    assert default.monthly_budget_per_user is None
    assert E.MONTHLY_BUDGET.name not in server_environment("jhub-alice", default)
    chosen = parse_config(kit.config_of(kit.render({"offload": {"monthlyBudgetPerUser": 250.5}})))
    env = server_environment("jhub-alice", chosen, "http://hub:10101/services/gpu-offload/")
    assert env[E.MONTHLY_BUDGET.name] == "250.5"
    assert from_environment({**env, "JUPYTERHUB_USER": "alice"}).budget == 250.5


PROTECTED_WORDS = "Notebook sessions in their first minutes (protected from preemption; only the kernel names it)"


def test_the_charts_session_protection_and_notice_reach_every_users_kernel_and_pod(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.hub_extension.spawner.user_namespace import server_environment
    from gpu_offload.liqo_peering.inventory import Inventory
    from gpu_offload.liqo_peering.kueue import desired
    from gpu_offload.liqo_peering.trust import TrustPolicy

    from gpu_offload.engine.backends.kube.config import from_environment

    queued = {"queueing": {"kueue": {"enabled": True}}}
    defaults = parse_config(kit.config_of(kit.render(queued)))
    kernel = from_environment({**server_environment("jhub-alice", defaults), "JUPYTERHUB_USER": "alice"})
    # by default: 10 min of protection at the class the hub adds, and a minute's notice to write the checkpoint
    assert (kernel.session_protection, kernel.protected_priority, kernel.session_notice) == (
        600.0, "session-protected", 60)
    assert defaults.queueing is not None
    written = [c["metadata"]["name"] for c in desired(Inventory(()), TrustPolicy(), defaults.queueing).priority_classes]
    assert "session-protected" in written  # the hub's queue controller creates it in Kueue
    chosen = parse_config(kit.config_of(kit.render({
        "offload": {"sessionNotice": 180},
        "queueing": {"kueue": {"enabled": True, "sessionProtection": 120, "protectedPriorityClass": "first-minutes"}}})))
    env = server_environment("jhub-alice", chosen)
    assert (env["GPU_OFFLOAD_SESSION_PROTECTION"], env["GPU_OFFLOAD_PROTECTED_PRIORITY"],
            env["GPU_OFFLOAD_SESSION_NOTICE"]) == ("120", "first-minutes", "180")
    off = parse_config(kit.config_of(kit.render({"queueing": {"kueue": {"enabled": True, "sessionProtection": 0}}})))
    env = server_environment("jhub-alice", off)
    assert "GPU_OFFLOAD_SESSION_PROTECTION" not in env and "GPU_OFFLOAD_PROTECTED_PRIORITY" not in env
    assert off.queueing is not None and [c.name for c in off.queueing.priority_classes] == ["interactive", "batch"]
    no_queue = server_environment("jhub-alice", parse_config(kit.config_of(kit.render())))
    assert "GPU_OFFLOAD_SESSION_PROTECTION" not in no_queue  # Kueue preempts; without it there is nothing to hold
    assert no_queue["GPU_OFFLOAD_SESSION_NOTICE"] == "60"  # a drain or an eviction gives the same notice
    with pytest.raises(Exception, match="sessionProtection"):
        kit.render({"queueing": {"kueue": {"enabled": True, "sessionProtection": "10m"}}})  # seconds
    with pytest.raises(Exception, match="sessionNotice"):
        kit.render({"offload": {"sessionNotice": -1}})
    # the admin's own class for it must outrank every class that could preempt a protected session
    low = {"queueing": {"kueue": {"enabled": True, "priorityClasses": [
        {"name": "interactive", "value": 1000}, {"name": "session-protected", "value": 500}]}}}
    with pytest.raises(ValueError, match=r"'session-protected' has value 500, not above every other class \(the "
                       r"highest is 1000\)"):
        parse_config(kit.config_of(kit.render(low)))


def test_the_charts_session_idle_timeout_reaches_every_users_kernel(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.hub_extension.spawner.user_namespace import server_environment

    from gpu_offload.engine.backends.kube.config import from_environment

    default = parse_config(kit.config_of(kit.render()))
    environment = server_environment("jhub-alice", default)
    assert environment["GPU_OFFLOAD_SESSION_IDLE_TIMEOUT"] == "3600"  # on by default: an hour
    assert from_environment(environment).session_idle_timeout == 3600.0
    never = parse_config(kit.config_of(kit.render({"offload": {"sessionIdleTimeout": 0}})))
    assert "GPU_OFFLOAD_SESSION_IDLE_TIMEOUT" not in server_environment("jhub-alice", never)
    with pytest.raises(Exception, match="sessionIdleTimeout"):
        kit.render({"offload": {"sessionIdleTimeout": "1h"}})  # the schema wants seconds
    with pytest.raises(ValueError, match=r"offload.sessionIdleTimeout=-5 must be a whole number of seconds"):
        parse_config({"offload": {"sessionIdleTimeout": -5}})  # a configuration file written by hand
