"""Fixtures for the Helm chart (an umbrella over zero-to-jupyterhub): render through Helm's own Go SDK.

The chart as shipped names zero-to-jupyterhub's published repository; here a copy of the chart in a temporary
folder gets ../shared/z2jh-chart/jupyterhub as its dependency (nothing of it is copied into the repository).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "gpu-offload"
# shared/ sits beside the repository (a fresh clone in CI, the work tree on a developer's machine).
SHARED = (REPO / ".." / "shared").resolve()
Z2JH_CHART = SHARED / "z2jh-chart" / "jupyterhub"

RELEASE = "gpu-offload"
HUB_NAMESPACE = "jhub"
# The oldest Kubernetes the chart supports (zero-to-jupyterhub 4 needs 1.32); pinned so a newer
# kubernetes-validate release cannot change what "valid" means under the tests.
KUBE_VERSION = "1.32.0"

TWO_TENANTS = {"liqo": {"tenantNamespaces": ["liqo-tenant-alpha", "liqo-tenant-beta"]}}

Render = Callable[..., list[dict[str, Any]]]


def place_chart(folder: Path) -> Path:
    """A copy of the chart in ``folder`` with zero-to-jupyterhub from ../shared in its charts/, as
    `helm dependency update` would leave it."""
    assert Z2JH_CHART.is_dir(), f"{Z2JH_CHART} is missing: the helm tests need ../shared/z2jh-chart beside the repository"
    placed = folder / CHART_DIR.name
    shutil.copytree(CHART_DIR, placed, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    shutil.copytree(Z2JH_CHART, placed / "charts" / "jupyterhub")
    return placed


@pytest.fixture(scope="session")
def placed_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart with its dependency in place."""
    return place_chart(tmp_path_factory.mktemp("umbrella"))


@pytest.fixture(scope="module")
def chart(placed_chart: Path) -> Iterator[helm.Chart]:
    """The chart, loaded by Helm."""
    with helm.Chart.load(placed_chart) as loaded:
        yield loaded


def render_manifests(
    chart: helm.Chart, values: dict[str, Any] | None = None, **options: Any
) -> dict[str, str]:
    """Helm's rendering of every template (path -> text), as `helm install` would on a new release."""
    options.setdefault("name", RELEASE)
    options.setdefault("namespace", HUB_NAMESPACE)
    return chart.render(values=values, is_install=True, **options)


def objects_of(manifests: dict[str, str], ours: bool = True) -> list[dict[str, Any]]:
    """The Kubernetes objects among rendered manifests (NOTES.txt is text for the operator): this chart's own
    templates' only, or with ``ours=False`` zero-to-jupyterhub's too."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt") or (ours and "/charts/" in path):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


@pytest.fixture(scope="module")
def render(chart: helm.Chart) -> Render:
    """Render the chart with values and return its objects."""

    def _render(values: dict[str, Any] | None = None, **options: Any) -> list[dict[str, Any]]:
        return objects_of(render_manifests(chart, values, **options))

    return _render


def find(objects: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The one object of that kind and name (and namespace), or a failure naming what exists."""
    hits = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    present = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
    assert len(hits) == 1, f"expected one {kind}/{name} in the render, found {len(hits)} among {present}"
    return hits[0]


def config_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The service's configuration file as the hub pod will read it from the chart's ConfigMap."""
    configmap = find(objects, "ConfigMap", f"{RELEASE}-config")
    parsed: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return parsed


def hook_bindings(config: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    """The two RoleBindings the spawner hook creates in a user namespace, from the chart's config."""
    names = config["userNamespaces"]

    def binding(name: str, role: str, subject: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", **subject}],
        }

    hub = {"namespace": config["hubNamespace"], "name": config["hubServiceAccount"]}
    server = {"namespace": namespace, "name": names["userServerServiceAccount"]}
    return [
        binding("gpu-offload-hub", names["hubClusterRole"], hub),
        binding("gpu-offload-user-server", names["userServerClusterRole"], server),
    ]


@dataclass(frozen=True)
class Kit:
    """What the helm tests share (pytest's importlib mode lets tests import nothing from conftest)."""

    chart: helm.Chart
    render: Render
    manifests: Callable[..., dict[str, str]]
    objects: Render
    """Like render, with zero-to-jupyterhub's objects too."""
    find: Callable[..., dict[str, Any]]
    config_of: Callable[[list[dict[str, Any]]], dict[str, Any]]
    hook_bindings: Callable[[dict[str, Any], str], list[dict[str, Any]]]
    chart_dir: Path = CHART_DIR
    """The chart with its dependency in place (what `helm lint` and `helm install` are given)."""
    shared: Path = SHARED
    release: str = RELEASE
    hub_namespace: str = HUB_NAMESPACE
    kube_version: str = KUBE_VERSION
    two_tenants: Any = None


@pytest.fixture(scope="module")
def kit(chart: helm.Chart, render: Render, placed_chart: Path) -> Kit:
    """Chart, renderer, lookups and constants in one object."""

    def _manifests(values: dict[str, Any] | None = None, **options: Any) -> dict[str, str]:
        return render_manifests(chart, values, **options)

    def _objects(values: dict[str, Any] | None = None, **options: Any) -> list[dict[str, Any]]:
        return objects_of(render_manifests(chart, values, **options), ours=False)

    return Kit(chart, render, _manifests, _objects, find, config_of, hook_bindings, chart_dir=placed_chart,
               two_tenants=TWO_TENANTS)
