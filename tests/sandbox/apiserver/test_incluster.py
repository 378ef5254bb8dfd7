"""A program in a sandbox pod reaches the API as in a cluster pod: the official client's in-cluster
configuration (service account token, CA, namespace, KUBERNETES_SERVICE_HOST/PORT) over TLS. Root only:
the files are bound at their real path in the container's mount namespace."""

from __future__ import annotations

import os
import shutil

import pytest
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import running_origin

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="pod namespaces and users need root and iproute2")
core, namespace = fixtures.core, fixtures.namespace

# what a user's server does: in-cluster configuration, then a call in its own namespace
LIST_OWN_PODS = (
    "import kubernetes\n"
    "kubernetes.config.load_incluster_config()\n"
    "ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()\n"
    "pods = kubernetes.client.CoreV1Api().list_namespaced_pod(ns).items\n"
    "print('sees', ns, sorted(p.metadata.name for p in pods))\n"
)


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    with running_origin(tmp_path_factory.mktemp("incluster"), 1, in_cluster_api=True) as running:
        yield running


def _pod(name: str, **spec) -> dict:
    # a notebook-like image of the project runtime (it has the kubernetes client), as a non-root user
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "securityContext": {"runAsUser": 1000, "runAsGroup": 100, "runAsNonRoot": True},
        "containers": [{"name": "main", "image": "jupyter-gpu-offload/singleuser:test",
                        "command": ["python3", "-c", LIST_OWN_PODS]}], **spec}}


def _finished(core, namespace: str, name: str):
    return wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase
                      in ("Succeeded", "Failed") and p, f"pod {namespace}/{name} to finish", timeout=120)


def _log(core, namespace: str, name: str) -> str:
    return core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()


def test_a_pod_uses_the_official_clients_in_cluster_configuration(core, namespace, origin) -> None:
    core.create_namespaced_pod(namespace, _pod("reader"))
    pod = _finished(core, namespace, "reader")
    log = _log(core, namespace, "reader")
    assert pod.status.phase == "Succeeded", log
    assert f"sees {namespace} ['reader']" in log


def test_automount_off_on_the_pod_or_its_account_gives_no_token(core, namespace, origin) -> None:
    core.create_namespaced_pod(namespace, _pod("unmounted", automountServiceAccountToken=False))
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "quiet"},
                                                       "automountServiceAccountToken": False})
    core.create_namespaced_pod(namespace, _pod("quiet-account", serviceAccountName="quiet"))
    for name in ("unmounted", "quiet-account"):
        pod = _finished(core, namespace, name)
        log = _log(core, namespace, name)
        assert pod.status.phase == "Failed" and "Service token file does not exist" in log, log
