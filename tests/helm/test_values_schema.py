"""Bad values are refused before anything is rendered, with a message that names the key and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

BAD_VALUES_FILE = """\
liqo:
  tenantNamespaces:
    - liqo-tenant-alpha
    - Liqo_Tenant_Beta
"""


def _values_file(tmp_path: Path, text: str) -> dict[str, Any]:
    """A values file as `helm install -f` reads it (Helm's own YAML loader)."""
    path = tmp_path / "my-values.yaml"
    path.write_text(text)
    return helm.values_from_yaml(path.read_text())


def test_the_chart_defaults_satisfy_the_schema(kit: Any) -> None:
    kit.chart.validate_schema(None)
    assert kit.chart.schema is not None


def test_a_bad_values_file_is_refused_by_render_and_by_lint_naming_the_entry(
    kit: Any, tmp_path: Path
) -> None:
    values = _values_file(tmp_path, BAD_VALUES_FILE)
    with pytest.raises(helm.HelmValuesError) as refused:
        kit.manifests(values)
    message = str(refused.value)
    assert "/liqo/tenantNamespaces/1" in message and "Liqo_Tenant_Beta" in message

    report = helm.lint(kit.chart_dir, values, strict=True, namespace=kit.hub_namespace)
    assert any("/liqo/tenantNamespaces/1" in error for error in report["errors"]), report


@pytest.mark.parametrize(
    "values, where, what",
    [
        (
            {"usageDatabse": {"url": "postgresql://x@db/u"}},
            "at ''",
            "additional properties 'usageDatabse' not allowed",
        ),
        ({"service": {"port": "10101"}}, "/service/port", "got string, want integer"),
        ({"service": {"port": 80}}, "/service/port", "minimum: got 80"),
        ({"usageDatabase": {"persistence": {"enabled": False}}}, "/usageDatabase",
         "additional properties 'persistence' not allowed"),
        ({"usageDatabase": {"url": "db.example:5432"}}, "/usageDatabase/url", "does not match pattern"),
        (
            {"userServer": {"serviceAccountName": "Alice's"}},
            "/userServer/serviceAccountName",
            "does not match",
        ),
        (
            {"liqo": {"tenantNamespaces": ["liqo-tenant-a", "liqo-tenant-a"]}},
            "/liqo/tenantNamespaces",
            "items at 0 and 1 are equal",
        ),
        ({"admissionPolicy": {"enabled": "yes"}}, "/admissionPolicy/enabled", "want boolean"),
        (
            {"offload": {"objectStorage": {"endpoint": "s3.local"}}},
            "/offload/objectStorage/endpoint",
            "pattern",
        ),
        ({"clusters": {"donor-1": {"trusted": "yes"}}}, "/clusters/donor-1/trusted", "want boolean"),
        ({"clusters": {"donor-1": {"trust": True}}}, "/clusters/donor-1", "additional properties 'trust'"),
        ({"clusters": {"donor-1": {"pricePerGpuHour": -1}}}, "/clusters/donor-1/pricePerGpuHour", "minimum"),
        ({"userNamespaces": {"podSecurity": "privileged"}}, "/userNamespaces/podSecurity", "value must be one of"),
        ({"offload": {"monthlyBudgetPerUser": -5}}, "/offload/monthlyBudgetPerUser", "minimum"),
        ({"offload": {"monthlyBudgetPerUser": "100 EUR"}}, "/offload/monthlyBudgetPerUser", "want null or number"),
        ({"offload": {"allowedImages": ["python 3"]}}, "/offload/allowedImages/0", "pattern"),
        ({"queueing": {"kueue": {"enabled": True, "localQueue": "gpu.queue"}}}, "/queueing/kueue/localQueue",
         "pattern"),
        ({"queueing": {"kueue": {"enabled": True, "priorityClasses": [{"name": "batch", "value": "low"}]}}},
         "/queueing/kueue/priorityClasses/0/value", "want integer"),
        ({"queueing": {"kueue": {"enabled": True, "sessionIdleTimeout": 600}}}, "/queueing/kueue",
         "additional properties 'sessionIdleTimeout'"),
    ],
)
def test_schema_violations_name_the_key_and_the_rule(
    kit: Any, values: dict[str, Any], where: str, what: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        kit.chart.validate_schema(values)
    assert where in str(refused.value) and what in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    "values, fix",
    [
        (
            {"jupyterhub": {"hub": {"db": {"type": "postgres", "url": "postgresql://hub@db/hub"}}}},
            "usageDatabase.url is empty and jupyterhub.hub.db.type is postgres, so the usage database would have "
            "no volume and GPU usage would be lost at every hub restart. Set usageDatabase.url",
        ),
        (
            {"service": {"port": 10200}},
            "service.port is 10200 but jupyterhub.hub.service.extraPorts has no entry {name: gpu-offload, port: "
            "10200, targetPort: 10200}",
        ),
        (
            {"jupyterhub": {"singleuser": {"serviceAccountName": "default"}}},
            'jupyterhub.singleuser.serviceAccountName is "default" but userServer.serviceAccountName is '
            '"gpu-offload-user-server"',
        ),
        (
            {"queueing": {"kueue": {"enabled": True, "defaultPriority": "urgent"}}},
            "queueing.kueue.defaultPriority=urgent is not one of queueing.kueue.priorityClasses (interactive, "
            "batch): name one of them, or add it to the list",
        ),
        (
            {"metrics": {"serviceMonitor": {"enabled": True}}},
            "the service answers 403 to a scrape without a token. Name a Secret holding a hub API token with "
            "the read:metrics scope, or set metrics.open=true",
        ),
    ],
    ids=["no volume and no url", "service port not the hub's extra port", "servers run as another account",
         "default priority not a class",
         "service monitor without a token"],
)
def test_rules_between_values_say_what_to_set(kit: Any, values: dict[str, Any], fix: str) -> None:
    kit.chart.validate_schema(values)  # each value alone is fine...
    with pytest.raises(helm.HelmRenderError) as refused:  # ...together they are not
        kit.manifests(values)
    assert fix in str(refused.value)
