"""The whole path on the Liqo pair, from a hub login to the donor's GPU (issue 26, step 3).

The origin's umbrella chart is installed with ``helm`` (zero-to-jupyterhub from ../shared as its dependency, the
project's images); a user gets a token through the hub's API, spawns a server and runs the quickstart notebook
in it through the server's kernel API; its offloaded cells (the numpy array through object storage, a moto S3
server both clusters' pods reach) and its session run on the donor's kubelet through Liqo's virtual node, queued
by Kueue on the origin; the service's pages, metrics and meter see them; the server stops, the release is
uninstalled and neither cluster keeps anything of it.

Not here: a distributed run and a Metaflow step through the hub. Liqo's networking cannot run on this machine
(docs/realcluster.md: its kernel has no Geneve), so ranks on the donor cannot rendezvous through a Service of the
origin; and neither has been written against the hub on the pair yet.

Needs the origin's Liqo to keep Kueue's queue-name label off donor pods (``liqo.sh test`` runs this module in
that setting): with Liqo's default the donor's Kueue gates every queued pod (test_real_liqo.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox import objectstore

from ..helm.conftest import place_chart
from .hubpath import (
    BUCKET,
    HUB_DB_DIR,
    HUB_NAMESPACE,
    RELEASE,
    STORAGE_HOST,
    Hub,
    execute,
    helm,
    hub_db_volume,
    install,
    new_token,
    notebook_cells,
)
from .liqopair import Pair, pair, wait
from .test_real_liqo import QUEUE_LABEL, virtual_node_skips

# a helm install, a server start and a notebook on two real clusters of a shared 2-core machine
pytestmark = [pytest.mark.real_liqo, pytest.mark.e2e, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
USER = "alice"
SERVER_LABELS = f"component=singleuser-server,hub.jupyter.org/username={USER}"


@pytest.fixture(scope="module")
def liqo() -> Iterator[Pair]:
    with pair() as p:
        if QUEUE_LABEL not in virtual_node_skips(p):
            pytest.skip(f"the origin's Liqo copies {QUEUE_LABEL} to donor pods, so the donor's Kueue would gate "
                        "every queued cell; liqo.sh test runs this module after keeping it off")
        yield p


@pytest.fixture(scope="module")
def storage() -> Iterator[str]:
    """The object store's endpoint (moto's S3 server in this process, on the origin's bridge address)."""
    with objectstore.s3_server(STORAGE_HOST, [BUCKET]) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def hub(liqo: Pair, storage: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hub, str]]:
    """The release installed on the origin, its hub answering through the proxy: (hub, admin token)."""
    core = liqo.core("origin")
    # a new hub database: a release installed again on a running pair starts without the last one's users
    shutil.rmtree(HUB_DB_DIR, ignore_errors=True)
    HUB_DB_DIR.mkdir(parents=True)
    os.chown(HUB_DB_DIR, 1000, 1000)  # the hub runs as uid 1000
    with contextlib.suppress(kubernetes.client.ApiException):
        core.create_persistent_volume(hub_db_volume())
    folder = tmp_path_factory.mktemp("hub")
    admin = new_token()
    try:
        install(place_chart(folder), folder / "values.yaml", admin, storage)
        proxy = wait(lambda: _ready_pod(core, "component=proxy"), "the proxy pod Ready", 600)
        first = wait(lambda: _ready_pod(core, "component=hub"), "the hub pod Ready", 600)
        # The hub comes back after a restart: its pod is created again once the chart's admission policies are
        # in force (the first one raced them).
        core.delete_namespaced_pod(first.metadata.name, HUB_NAMESPACE)
        wait(lambda: (pod := _ready_pod(core, "component=hub")) and pod.metadata.uid != first.metadata.uid and pod,
             "the hub pod Ready again after a restart", 600)
        hub = Hub(f"http://{proxy.status.pod_ip}:8000/")
        wait(lambda: hub.status("hub/api/", admin) == 200 or None, "the hub's API through the proxy", 120)
        yield hub, admin
    finally:
        _remove(liqo)


def _ready_pod(core: Any, selector: str) -> Any:
    for pod in core.list_namespaced_pod(HUB_NAMESPACE, label_selector=selector).items:
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            return pod
    return None


def _remove(liqo: Pair) -> None:
    """Uninstall and delete what the release and its users made on the origin (idempotent)."""
    with contextlib.suppress(AssertionError):
        helm("uninstall", RELEASE, "--namespace", HUB_NAMESPACE, "--wait", "--timeout", "3m")
    core = liqo.core("origin")
    for ns in core.list_namespace().items:
        if ns.metadata.name == HUB_NAMESPACE or ns.metadata.name.startswith(f"{HUB_NAMESPACE}-"):
            with contextlib.suppress(kubernetes.client.ApiException):
                core.delete_namespace(ns.metadata.name)
    with contextlib.suppress(kubernetes.client.ApiException):
        core.delete_persistent_volume(hub_db_volume()["metadata"]["name"])


class Watcher:
    """What ran where while the notebook ran: the donor's pods (any namespace) and the origin's admitted
    Workloads, sampled every second (one-shot cells' pods and Workloads are gone soon after)."""

    def __init__(self, liqo: Pair, user_namespace: str) -> None:
        self.liqo, self.namespace = liqo, user_namespace
        self.donor_pods: dict[str, dict[str, Any]] = {}
        self.admitted: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                self.sample()

    def sample(self) -> None:
        for pod in self.liqo.core("donor").list_pod_for_all_namespaces().items:
            if pod.metadata.namespace.startswith(self.namespace):
                self.donor_pods[pod.metadata.name] = {
                    "namespace": pod.metadata.namespace, "node": pod.spec.node_name,
                    "labels": dict(pod.metadata.labels or {}), "phase": pod.status.phase,
                    "gpus": [c.resources.limits.get("nvidia.com/gpu") for c in pod.spec.containers
                             if c.resources and c.resources.limits]}
        workloads = self.liqo.custom("origin").list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", self.namespace, "workloads")["items"]
        for wl in workloads:
            if (wl.get("status") or {}).get("admission"):
                self.admitted[wl["metadata"]["name"]] = wl["status"]["admission"]


def test_a_user_logs_in_spawns_a_server_and_runs_the_quickstart_on_the_donor(liqo: Pair, hub: tuple[Hub, str]) -> None:
    api, admin = hub
    # the user: created by the admin service, then a token of their own, as a login gives one
    api.call("POST", f"hub/api/users/{USER}", admin)
    token = api.call("POST", f"hub/api/users/{USER}/tokens", admin, {"expires_in": 3600, "note": "e2e"})["token"]
    assert api.call("GET", "hub/api/user", token)["name"] == USER
    api.call("POST", f"hub/api/users/{USER}/server", token, {})
    wait(lambda: (api.call("GET", f"hub/api/users/{USER}", token)["servers"].get("") or {}).get("ready") or None,
         "the user's server ready", 600)
    (server,) = liqo.core("origin").list_pod_for_all_namespaces(label_selector=SERVER_LABELS).items
    namespace = server.metadata.namespace
    assert namespace == f"{HUB_NAMESPACE}-{USER}", "the server runs in the user's own namespace"
    kernel = api.call("POST", f"user/{USER}/api/kernels", token, {"name": "python3"})["id"]
    outputs: list[str] = []
    with Watcher(liqo, namespace) as seen:
        for code in notebook_cells(REPO / "examples" / "quickstart.ipynb"):
            if code.startswith("%gpu_offload sessions"):
                # before the session is closed: its pod runs on the donor's kubelet
                seen.sample()
                running = [n for n, p in seen.donor_pods.items() if p["phase"] == "Running"]
                assert running, f"no session pod running on the donor: {seen.donor_pods}"
            outputs.append(execute(api, USER, kernel, token, code))
    print("\n----\n".join(outputs))
    text = "\n".join(outputs)
    assert "step 2" in outputs[1] and "total in the notebook: 45" in outputs[2], outputs[1:3]
    # the numpy array made in the kernel, normalised on the donor and back; the figure drawn on the donor
    assert "mean 0.0 std 1.0" in outputs[4] and "ndarray (1000000,) float64" in outputs[5], outputs[3:6]
    assert "[image/png]" in outputs[6], outputs[6]
    assert "counter on the runner: 2" in text
    assert seen.donor_pods, "no pod of the user's cells ran on the donor"
    assert all(p["node"] == "donor-gpu" for p in seen.donor_pods.values()), seen.donor_pods
    assert all(QUEUE_LABEL not in p["labels"] for p in seen.donor_pods.values())
    assert seen.admitted, "Kueue on the origin admitted no Workload of the user's cells"
    _the_service_sees_the_runs(api, admin, token)
    api.call("DELETE", f"hub/api/users/{USER}/server", token)
    core = liqo.core("origin")
    wait(lambda: not core.list_namespaced_pod(namespace).items or None, "the user's pods gone", 300)
    wait(lambda: not [p for p in liqo.core("donor").list_pod_for_all_namespaces().items
                      if p.metadata.namespace.startswith(namespace)] or None, "the user's pods gone on the donor", 120)
    assert not liqo.custom("origin").list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
    assert not [s.metadata.name for s in core.list_namespaced_secret(namespace).items
                if (s.metadata.labels or {}).get("gpu-offload.io/managed-by") == "gpu-offload"]


def _the_service_sees_the_runs(api: Hub, admin: str, token: str) -> None:
    mine = api.call("GET", "services/gpu-offload/api/me", token)
    print("api/me", mine)
    assert mine, "the user's meter is empty"
    usage = api.call("GET", "services/gpu-offload/api/admin/usage", admin)
    print("usage", usage)
    assert USER in str(usage)
    metrics = api.call("GET", "services/gpu-offload/metrics", admin)
    assert f'user="{USER}"' in metrics, metrics[:2000]
    for page in ("", "users", "queues", f"clusters/{'donor'}"):
        assert api.status(f"services/gpu-offload/{page}", admin) == 200, page


def test_uninstalled_release_leaves_nothing_on_either_cluster(liqo: Pair, hub: tuple[Hub, str]) -> None:
    _remove(liqo)
    core = liqo.core("origin")
    wait(lambda: not [n.metadata.name for n in core.list_namespace().items
                      if n.metadata.name.startswith(HUB_NAMESPACE)] or None, "the hub's namespaces gone", 300)
    donor = liqo.core("donor")
    wait(lambda: not [n.metadata.name for n in donor.list_namespace().items
                      if n.metadata.name.startswith(HUB_NAMESPACE)] or None, "their twins on the donor gone", 120)
