"""The chart lints clean, renders through Helm's Go SDK, and every object it renders is valid Kubernetes."""

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
        "usageDatabase": {"url": "postgresql://usage@db:5432/usage", "persistence": {"enabled": False}}
    },
    "z2jh's own hub account": {"hub": {"serviceAccount": {"create": False, "name": "hub"}}},
    "no admission policy": {"admissionPolicy": {"enabled": False}},
    "storage class and prefix": {
        "usageDatabase": {"persistence": {"storageClassName": "fast-ssd", "size": "5Gi"}},
        "userNamespaces": {"prefix": "jupyter-"},
    },
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
        ["ServiceAccount", "ConfigMap", "PersistentVolumeClaim"]
        + ["ClusterRole"] * 4
        + ["ClusterRoleBinding"] * 2
        + ["Role", "RoleBinding"] * 2
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
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
        elif obj["kind"] in {"Role", "RoleBinding"}:
            assert namespace in kit.two_tenants["liqo"]["tenantNamespaces"], obj["metadata"]
        else:
            assert namespace == kit.hub_namespace, obj["metadata"]


def test_the_usage_volume_follows_its_toggle_and_survives_uninstall(kit: Any) -> None:
    claim = kit.find(kit.render(), "PersistentVolumeClaim", "gpu-offload-usage-db")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert kit.config_of(kit.render())["usageDatabase"]["url"] == "sqlite:////srv/gpu-offload/usage.sqlite"

    external = kit.render(VARIANTS["external database"])
    assert not [o for o in external if o["kind"] == "PersistentVolumeClaim"]
    assert kit.config_of(external)["usageDatabase"]["url"] == "postgresql://usage@db:5432/usage"


def test_the_hub_account_is_created_or_reused(kit: Any) -> None:
    created = kit.render()
    kit.find(created, "ServiceAccount", "gpu-offload-hub", kit.hub_namespace)

    reused = kit.render(VARIANTS["z2jh's own hub account"])
    assert not [o for o in reused if o["kind"] == "ServiceAccount"]
    for binding in (o for o in reused if o["kind"].endswith("Binding") and "subjects" in o):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "hub", "namespace": kit.hub_namespace}
        ]


def test_the_config_names_every_object_the_spawner_hook_must_bind(kit: Any) -> None:
    objects = kit.render(kit.two_tenants)
    config = kit.config_of(objects)
    assert config["hubNamespace"] == kit.hub_namespace
    kit.find(objects, "ServiceAccount", config["hubServiceAccount"])
    kit.find(objects, "ClusterRole", config["userNamespaces"]["hubClusterRole"])
    kit.find(objects, "ClusterRole", config["userNamespaces"]["userServerClusterRole"])
    assert config["userNamespaces"]["prefix"] == f"{kit.hub_namespace}-"
    assert config["userNamespaces"]["label"] == "gpu-offload.io/user-namespace"
    assert config["liqo"]["tenantNamespaces"] == ["liqo-tenant-alpha", "liqo-tenant-beta"]
    assert config["peering"]["liqoctlEnabled"] is False


def test_another_release_name_prefixes_every_object(kit: Any) -> None:
    objects = kit.render(kit.two_tenants, name="lab")
    names = {o["metadata"]["name"] for o in objects}
    assert all(name.startswith("lab-gpu-offload-") for name in names), names


def test_notes_tell_the_next_step_and_warn_about_what_is_missing(kit: Any) -> None:
    notes = kit.manifests()["gpu-offload/templates/NOTES.txt"]
    assert "helm/z2jh-overlay.yaml" in notes
    assert "liqo.tenantNamespaces is empty" in notes
    assert "WARNING: helm/z2jh-overlay.yaml names" not in notes

    other = kit.manifests({**kit.two_tenants, "admissionPolicy": {"enabled": False}}, name="lab")[
        "gpu-offload/templates/NOTES.txt"
    ]
    assert "liqo-tenant-alpha, liqo-tenant-beta" in other
    assert "admissionPolicy.enabled is false" in other
    assert 'release called "gpu-offload"' in other


def test_strict_validation_catches_a_misspelt_field_in_a_rendered_rbac_object(kit: Any) -> None:
    """Strict mode is on: an unknown field (what a template typo produces) fails, it is not ignored."""
    role = kit.find(kit.render(), "ClusterRole", "gpu-offload-user-server")
    role["rules"][0]["verb"] = role["rules"][0].pop("verbs")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(role, kit.kube_version, strict=True)
