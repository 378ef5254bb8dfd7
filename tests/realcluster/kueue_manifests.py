"""Kueue's own install manifests (its kustomize default, rendered from the Go module of the version built)
adapted to a Kueue that runs as a process on the node instead of a Deployment, and Kueue's configuration as
docs/queueing.md tells an admin to write it.

    kueue_manifests.py RENDERED HOST WEBHOOK_PORT VISIBILITY_PORT [all]   > manifests.yaml
    kueue_manifests.py --config CERT_DIR WEBHOOK_PORT VISIBILITY_PORT METRICS_PORT HEALTH_PORT [all] > config.yaml

``all`` (env.sh's RC_KUEUE_MANAGED, set for the Liqo stage's donor): Kueue manages every namespace but its own
and kube-system, its default, as a donor cluster that runs Kueue for its own users often has it.

Only the Deployment is dropped and the Services lose their selectors, gaining Endpoints at the process's
address; and the job webhooks' namespace selector follows ``managedJobsNamespaceSelector``, as Kueue's Helm
chart makes it (its kustomize default selects every namespace but kube-system and kueue-system). The CRDs,
the rest of the webhook configurations, the APIServices and the RBAC are Kueue's, unchanged."""

from __future__ import annotations

import sys
from typing import Any

import yaml

NAMESPACE = "kueue-system"
# The Service each listener of the process stands behind, with the Service port name the Endpoints must
# repeat (the API server matches a Service port to an endpoint port by name).
SERVICES = {"kueue-webhook-service": "webhook", "kueue-visibility-server": "visibility"}
MANAGED_NAMESPACES = {"matchLabels": {"gpu-offload.io/user-namespace": "true"}}
PODS_READY_TIMEOUT = "45s"
"""Kueue's waitForPodsReady timeout on the test cluster (the tests read it)."""
KUSTOMIZE_JOB_SELECTOR = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                "values": ["kube-system", NAMESPACE]}]}


def adapt(documents: list[dict[str, Any]], host: str, ports: dict[str, int], managed: str = "") -> list[dict[str, Any]]:
    """The manifests without the Deployment, each Service of ``SERVICES`` pointed at ``host``."""
    out: list[dict[str, Any]] = []
    for doc in documents:
        if doc["kind"] == "Deployment":
            continue
        if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for webhook in doc["webhooks"]:
                if webhook.get("namespaceSelector") == KUSTOMIZE_JOB_SELECTOR and managed != "all":
                    webhook["namespaceSelector"] = MANAGED_NAMESPACES
        name = doc["metadata"]["name"]
        if doc["kind"] == "Service" and name in SERVICES:
            doc["spec"].pop("selector", None)
            (port,) = doc["spec"]["ports"]
            out.append(doc)
            endpoint_port = {"port": ports[SERVICES[name]], "protocol": "TCP"}
            if port.get("name"):
                endpoint_port["name"] = port["name"]
            out.append({"apiVersion": "v1", "kind": "Endpoints",
                        "metadata": {"name": name, "namespace": NAMESPACE},
                        "subsets": [{"addresses": [{"ip": host}], "ports": [endpoint_port]}]})
            continue
        out.append(doc)
    return out


def configuration(cert_dir: str, webhook: int, visibility: int, metrics: int, health: int, managed: str = ""
                  ) -> dict[str, Any]:
    """Kueue's Configuration: the upstream default with the settings docs/queueing.md asks for."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"port": webhook, "certDir": cert_dir},
        "visibilityServer": {"bindPort": visibility},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": "kueue-webhook-service",
                                   "webhookSecretName": "kueue-webhook-server-cert"},
        "integrations": {"frameworks": ["pod", "batch/job"]},
        "managedJobsNamespaceSelector": KUSTOMIZE_JOB_SELECTOR if managed == "all" else MANAGED_NAMESPACES,
        "admissionFairSharing": {"usageHalfLifeTime": "1h", "usageSamplingInterval": "1m",
                                 "resourceWeights": {"nvidia.com/gpu": 1, "cpu": 0, "memory": 0}},
        # An admin sets minutes (docs/queueing.md); the test cluster 45 s, so the PodsReady requeue test
        # (test_pods_ready_requeue.py) sees an eviction in a minute while pods that start do so well within it.
        "waitForPodsReady": {"timeout": PODS_READY_TIMEOUT, "requeuingStrategy": {"timestamp": "Eviction"}},
        "resources": {"excludeResourcePrefixes": ["ephemeral-storage"]},
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["--config"]:
        cert_dir, webhook, visibility, metrics, health, *managed = argv[1:]
        doc: Any = configuration(cert_dir, int(webhook), int(visibility), int(metrics), int(health), *managed)
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        return
    rendered, host, webhook, visibility, *managed = argv
    with open(rendered, encoding="utf-8") as fh:
        documents = [d for d in yaml.safe_load_all(fh) if d]
    adapted = adapt(documents, host, {"webhook": int(webhook), "visibility": int(visibility)}, *managed)
    sys.stdout.write(yaml.safe_dump_all(adapted, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1:])
