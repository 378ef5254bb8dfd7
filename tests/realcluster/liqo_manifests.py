"""Liqo's own Helm chart (from the Go module of the version built) rendered for a Liqo whose components run as
processes on this machine, with networking off.

    liqo_manifests.py OUT CHART VERSION CLUSTER_ID API_SERVER_URL HOST WEBHOOK_PORT POD_CIDR SERVICE_CIDR \
        [LABELS_NOT_REFLECTED,...]

writes OUT/crds.yaml, OUT/manifests.yaml and OUT/<component>.args (the arguments of each dropped Deployment's
container, one a line, its environment references resolved).

The chart is rendered by Helm's own Go SDK (``helm_python``) with the values an admin would pass
(``--set networking.enabled=false`` and the cluster's id and API server address) and these changes:

- no Deployment, CronJob or hook Job: the controller manager, webhook and CRD replicator run as processes with
  the arguments of their Deployments (``liqo.sh`` reads them from ``OUT/<component>.args``), and
  telemetry is off (it would call Liqo's servers);
- the webhook's Service has no selector and Endpoints at ``HOST``, as Kueue's (no kube-proxy runs here);
- the virtual kubelet's image is never pulled (``pullPolicy: Never``): the Deployment Liqo makes for each
  virtual node stays unscheduled-or-waiting, and ``liqo.sh`` runs the virtual kubelet as a process with that
  Deployment's arguments and ServiceAccount instead.

The CRDs, RBAC, webhook configurations, VkOptionsTemplate and ConfigMaps are Liqo's, unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

NAMESPACE = "liqo"
WEBHOOK_SERVICE = "liqo-webhook"
DROPPED = {"Deployment", "CronJob", "Job"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                  "APIService", "StorageClass", "RuntimeClass", "Namespace", "CustomResourceDefinition"}


def values(version: str, cluster_id: str, api_server: str, cidrs: tuple[str, str],
           labels_not_reflected: list[str]) -> dict[str, Any]:
    """The chart values of this install: what `liqoctl install` would pass with networking disabled (it
    fills the pod and service CIDRs from the cluster)."""
    return {
        "ipam": {"podCIDR": cidrs[0], "serviceCIDR": cidrs[1]},
        "tag": version,
        "networking": {"enabled": False},
        "discovery": {"config": {"clusterID": cluster_id}},
        "apiServer": {"address": api_server},
        "telemetry": {"enabled": False},
        "metricAgent": {"enabled": False},
        "proxy": {"enabled": False},
        "pullPolicy": "Never",
        "offloading": {"reflection": {"skip": {"labels": labels_not_reflected}}},
    }


def render(chart: Path, chart_values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object Helm renders from Liqo's chart for a new release ``liqo`` in namespace ``liqo``."""
    with helm.Chart.load(chart) as loaded:
        manifests = loaded.render(values=chart_values, is_install=True, name="liqo", namespace=NAMESPACE)
    out: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if not path.endswith("NOTES.txt"):
            out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def adapt(documents: list[dict[str, Any]], host: str, webhook_port: int) -> tuple[list[dict[str, Any]],
                                                                                  list[dict[str, Any]]]:
    """(the objects to apply, the Deployments whose processes run instead)."""
    kept: list[dict[str, Any]] = []
    deployments: list[dict[str, Any]] = []
    for doc in documents:
        if doc["kind"] not in CLUSTER_SCOPED:
            # Helm puts a template without a namespace into the release's; kubectl apply would not
            doc["metadata"].setdefault("namespace", NAMESPACE)
        if doc["kind"] in DROPPED:
            if doc["kind"] == "Deployment":
                deployments.append(doc)
            continue
        if doc["kind"] == "Service" and doc["metadata"]["name"] == WEBHOOK_SERVICE:
            doc["spec"].pop("selector", None)
            (port,) = doc["spec"]["ports"]
            endpoint_port = {"port": webhook_port, "protocol": "TCP", **({"name": port["name"]} if port.get("name") else {})}
            kept += [doc, {"apiVersion": "v1", "kind": "Endpoints",
                           "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
                           "subsets": [{"addresses": [{"ip": host}], "ports": [endpoint_port]}]}]
            continue
        if doc["kind"] == "VkOptionsTemplate":
            doc["spec"]["pullPolicy"] = "Never"
        kept.append(doc)
    # Namespaces first, as `helm install --create-namespace` makes the release's own
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return [namespace, *kept], deployments


def crds(chart: Path) -> list[dict[str, Any]]:
    """Liqo's CRDs, from the chart's liqo-crds subchart (Helm installs a chart's crds/ before its templates)."""
    out: list[dict[str, Any]] = []
    for path in sorted((chart / "charts" / "liqo-crds" / "crds").glob("*.yaml")):
        out.extend(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)
    return out


def process_args(deployment: dict[str, Any], cluster_id: str) -> list[str]:
    """The container's arguments with the references to its environment that a process has no pod for
    resolved: the cluster id (from Liqo's ConfigMap), the namespace, the pod and Deployment names."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {"CLUSTER_ID": cluster_id, "POD_NAMESPACE": NAMESPACE, "POD_NAME": deployment["metadata"]["name"],
           "DEPLOYMENT_NAME": deployment["metadata"]["name"]}
    out = []
    for arg in container.get("args", []):
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        if "$(" in arg:
            raise SystemExit(f"liqo_manifests.py: {deployment['metadata']['name']} has an argument this script "
                             f"does not resolve: {arg}")
        out.append(arg)
    return out


def main(argv: list[str]) -> None:
    out_dir, chart_dir, version, cluster_id, api_server, host, webhook_port, pod_cidr, service_cidr, *skip = argv
    out, chart = Path(out_dir), Path(chart_dir)
    labels = [label for label in (skip[0].split(",") if skip else []) if label]
    objects, deployments = adapt(render(chart, values(version, cluster_id, api_server, (pod_cidr, service_cidr), labels)), host, int(webhook_port))
    (out / "crds.yaml").write_text(yaml.safe_dump_all(crds(chart), sort_keys=False), encoding="utf-8")
    (out / "manifests.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False), encoding="utf-8")
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = process_args(deployment, cluster_id)
        (out / f"{container['name']}.args").write_text("".join(f"{a}\n" for a in args), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
