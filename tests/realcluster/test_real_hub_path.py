"""The whole path on the Liqo pair, from a hub login to the donor's GPU (issue 26, step 3).

The origin's umbrella chart is installed with ``helm`` (zero-to-jupyterhub from ../shared as its dependency, the
project's images); a user gets a token through the hub's API, spawns a server and runs the quickstart notebook
in it through the server's kernel API; its offloaded cells (the numpy array through object storage, a moto S3
server both clusters' pods reach) and its session run on the donor's kubelet through Liqo's virtual node, queued
by Kueue on the origin; the service's pages, metrics and meter see them; the server stops, the release is
uninstalled and neither cluster keeps anything of it.

A Metaflow step too: the user's kernel runs ``python flow.py run``, whose ``@gpu_offload`` step's Job waits in
the user's LocalQueue on the origin and its pod runs on the donor's kubelet through Liqo, with its datastore in
the same store. And the admin asks the donor for more GPUs through the service's API: real Liqo makes a virtual
node of the slice the hub writes.

Not here: a distributed run. Liqo's networking cannot run on this machine (docs/realcluster.md: its kernel has
no Geneve), so ranks on the donor cannot rendezvous through a Service of the origin.

Needs the origin's Liqo to keep Kueue's queue-name label off donor pods (``liqo.sh test`` runs this module in
that setting): with Liqo's default the donor's Kueue gates every queued pod (test_real_liqo.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
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
from .liqopair import DONOR_ID, Pair, pair, wait
from .test_real_liqo import QUEUE_LABEL, virtual_node_skips

# a helm install, a server start and a notebook on two real clusters of a shared 2-core machine
pytestmark = [pytest.mark.real_liqo, pytest.mark.e2e, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
USER = "alice"
SERVER_LABELS = f"component=singleuser-server,hub.jupyter.org/username={USER}"
EXTRA_SLICE = "donor-extra-gpu"
# A cell of the user's: a flow with one offloaded step, written beside the notebook and run as a user runs it,
# with nothing set by hand: the namespace, the user, placement from configuration, the queue and trust come from
# the spawner, the datastore and the step image from the admin's values (hubpath.metaflow_settings).
FLOW = """
from metaflow import FlowSpec, environment, gpu_offload, step

class HubFlow(FlowSpec):
    @step
    def start(self):
        self.numbers = list(range(10))
        self.next(self.train)

    @gpu_offload(gpus=1, cluster="donor", priority="batch")
    @environment(vars={"AWS_ACCESS_KEY_ID": "e2e", "AWS_SECRET_ACCESS_KEY": "e2e", "AWS_DEFAULT_REGION": "us-east-1"})
    @step
    def train(self):
        import os
        self.total = sum(self.numbers)
        print(f"total={self.total} on the donor, GPU {os.environ.get('NVIDIA_VISIBLE_DEVICES')}")
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    HubFlow()
"""
FLOW_CELL = f"""
import pathlib, subprocess, sys
pathlib.Path("hub_flow.py").write_text({FLOW!r})
done = subprocess.run([sys.executable, "hub_flow.py", "run"], capture_output=True, text=True, timeout=840)
print(done.stdout[-6000:], done.stderr[-6000:])
print("flow exited", done.returncode)
from metaflow import Flow, namespace
namespace(None)
print("read back:", Flow("HubFlow").latest_run["train"].task.data.total)
"""


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


@dataclass(frozen=True)
class Server:
    """The user's running server: their token, namespace and a kernel of it."""

    token: str
    namespace: str
    kernel: str


@pytest.fixture(scope="module")
def server(liqo: Pair, hub: tuple[Hub, str]) -> Server:
    """The user logged in (a token of their own, as a login gives one) with a server and a kernel."""
    api, admin = hub
    # the user: created by the admin service, then a token of their own, as a login gives one
    api.call("POST", f"hub/api/users/{USER}", admin)
    token = api.call("POST", f"hub/api/users/{USER}/tokens", admin, {"expires_in": 3600, "note": "e2e"})["token"]
    assert api.call("GET", "hub/api/user", token)["name"] == USER
    api.call("POST", f"hub/api/users/{USER}/server", token, {})
    wait(lambda: (api.call("GET", f"hub/api/users/{USER}", token)["servers"].get("") or {}).get("ready") or None,
         "the user's server ready", 600)
    (pod,) = liqo.core("origin").list_pod_for_all_namespaces(label_selector=SERVER_LABELS).items
    namespace = pod.metadata.namespace
    assert namespace == f"{HUB_NAMESPACE}-{USER}", "the server runs in the user's own namespace"
    kernel = api.call("POST", f"user/{USER}/api/kernels", token, {"name": "python3"})["id"]
    return Server(token, namespace, kernel)


def test_a_user_logs_in_spawns_a_server_and_runs_the_quickstart_on_the_donor(
        liqo: Pair, hub: tuple[Hub, str], server: Server) -> None:
    api, admin = hub
    token, namespace, kernel = server.token, server.namespace, server.kernel
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


def test_a_metaflow_step_from_the_users_server_waits_in_the_queue_and_runs_on_the_donor(
        liqo: Pair, hub: tuple[Hub, str], server: Server) -> None:
    """``python flow.py run`` from the user's kernel: its ``@gpu_offload`` step's Job is queued by Kueue on the
    origin (the user's LocalQueue, from the spawner's settings), its pod goes through Liqo's virtual node to
    the donor's kubelet, the step's artifact comes back through the datastore (the admin's Metaflow settings:
    ``singleuser.extraEnv`` in hubpath.values), and the hub's meter bills the step's run to the user on the
    donor, as it bills cells: in ``api/me``, on the user's page and in the admin's usage."""
    api, admin = hub
    before = _runs_billed(api, admin)
    with Watcher(liqo, server.namespace) as seen:
        out = execute(api, USER, server.kernel, server.token, FLOW_CELL, timeout=900)
        seen.sample()
    print(out)
    assert "flow exited 0" in out and "total=45 on the donor" in out and "read back: 45" in out, out[-4000:]
    step_pods = {n: p for n, p in seen.donor_pods.items() if p["labels"].get("gpu-offload.io/step") == "train"}
    assert step_pods, f"the step's pod never ran on the donor: {seen.donor_pods}"
    assert all(p["node"] == "donor-gpu" and QUEUE_LABEL not in p["labels"] for p in step_pods.values()), step_pods
    assert [name for name in seen.admitted if name.startswith("job-")], \
        f"Kueue on the origin admitted no Workload of the step's Job: {sorted(seen.admitted)}"
    # the meter records a run when its pod ends: the step's pod has Succeeded by the time the flow returns
    billed = wait(lambda: [r for r in api.call("GET", "services/gpu-offload/api/me", server.token)["finished"]
                           if r["pod"] in step_pods] or None, "the step's run in the user's api/me", 120)
    print("the step's run as metered", billed)
    assert [(r["cluster_id"], r["gpus"], r["phase"]) for r in billed] == [(DONOR_ID, 1, "Succeeded")], billed
    assert billed[0]["cost"] > 0 and billed[0]["gpu_seconds"] > 0, billed  # the donor is priced: 2.0 a GPU-hour
    page = api.call("GET", "services/gpu-offload/me", server.token)
    assert billed[0]["pod"] in page, "the step's run is not on the user's page"
    # (at least: a quickstart pod deleted meanwhile may be recorded in between; api/me above names the step's pod)
    assert _runs_billed(api, admin) >= before + 1, "the admin's usage does not count the step's run"


def test_the_admin_asks_the_donor_for_gpus_and_real_liqo_makes_a_virtual_node(liqo: Pair, hub: tuple[Hub, str]) -> None:
    """The hub admin's "request GPUs" (the service's action API, with the hub's own RBAC) writes a ResourceSlice
    that the donor grants and Liqo turns into a virtual node with those GPUs; deleting it takes the node along."""
    api, admin = hub
    answer = api.call("POST", "services/gpu-offload/api/admin/actions/resourceslice", admin,
                      {"cluster_id": DONOR_ID, "gpus": "1", "name": EXTRA_SLICE, "confirm": True})
    assert answer["ok"], answer
    core, custom = liqo.core("origin"), liqo.custom("origin")
    try:
        node = wait(lambda: next((n for n in core.list_node().items if n.metadata.name == EXTRA_SLICE
                                  and (n.status.allocatable or {}).get("nvidia.com/gpu") == "1"), None),
                    "the slice's virtual node with 1 GPU", 300)
        assert node.metadata.labels["liqo.io/type"] == "virtual-node"
        assert node.metadata.labels["liqo.io/remote-cluster-id"] == DONOR_ID
        shown = api.call("GET", f"services/gpu-offload/api/admin/clusters/{DONOR_ID}", admin)["slices"]
        assert (EXTRA_SLICE, "1") in [(s["name"], str(s["granted_gpus"])) for s in shown], shown
    finally:  # the hub may not delete slices (its role has no delete): the cluster's admin does
        with contextlib.suppress(kubernetes.client.ApiException):
            custom.delete_namespaced_custom_object("authentication.liqo.io", "v1beta1", f"liqo-tenant-{DONOR_ID}",
                                                   "resourceslices", EXTRA_SLICE)
    wait(lambda: EXTRA_SLICE not in [n.metadata.name for n in core.list_node().items] or None,
         "the slice's virtual node gone", 300)


def test_the_stopped_server_leaves_nothing_of_the_users_runs(liqo: Pair, hub: tuple[Hub, str], server: Server) -> None:
    api, _admin = hub
    namespace = server.namespace
    api.call("DELETE", f"hub/api/users/{USER}/server", server.token)
    core = liqo.core("origin")
    # the step's finished Job (and its pod) go once Metaflow's TTL for finished Jobs, set by the admin, runs out
    wait(lambda: not core.list_namespaced_pod(namespace).items or None, "the user's pods gone", 300)
    wait(lambda: not kubernetes.client.BatchV1Api(liqo.origin).list_namespaced_job(namespace).items or None,
         "the step's Job gone", 120)
    wait(lambda: not [p for p in liqo.core("donor").list_pod_for_all_namespaces().items
                      if p.metadata.namespace.startswith(namespace)] or None, "the user's pods gone on the donor", 120)
    wait(lambda: not liqo.custom("origin").list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"] or None, "the user's Workloads gone", 120)
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


def _runs_billed(api: Hub, admin: str) -> int:
    """The runs the admin's usage bills to the user on the donor."""
    usage = api.call("GET", "services/gpu-offload/api/admin/usage", admin)["usage"]
    return sum(int(u["runs"]) for u in usage if u["user"] == USER and u["cluster_id"] == DONOR_ID)


def test_uninstalled_release_leaves_nothing_on_either_cluster(liqo: Pair, hub: tuple[Hub, str]) -> None:
    _remove(liqo)
    core = liqo.core("origin")
    wait(lambda: not [n.metadata.name for n in core.list_namespace().items
                      if n.metadata.name.startswith(HUB_NAMESPACE)] or None, "the hub's namespaces gone", 300)
    donor = liqo.core("donor")
    wait(lambda: not [n.metadata.name for n in donor.list_namespace().items
                      if n.metadata.name.startswith(HUB_NAMESPACE)] or None, "their twins on the donor gone", 120)
