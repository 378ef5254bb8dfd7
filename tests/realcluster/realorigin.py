"""The real cluster of ``up.sh`` as the tests' origin: the same handle the sandbox's origin fixtures give
(``.sandbox.kubeconfig``, ``.sandbox.api_client()``, ``.host_address``), seeded with the objects Liqo would
leave after peering the given donors, until real Liqo peers a real donor (issue 26).

The first two donors' Nodes are the real kubelets' nodes (``donor-1-gpu`` and ``donor-2-gpu``, ``env.sh``): pods
bound to them run in real containers with the fake device plugin's GPUs, of which as many are healthy (so
allocatable) as the donor has. Further donors get a Node that a heartbeat thread keeps Ready, as Liqo's virtual
kubelet does; nothing runs behind them, so only tests that place no pod there (queue sync, quotas) use them. A thread does what Liqo's controllers keep doing (leases, NamespaceOffloading status).
The Liqo objects and statuses come from the sandbox's own builders (``gpu_offload.sandbox.liqo``,
``gpu_offload.sandbox.offloading``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import install_crds, wait_until
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.liqo.offloading import offloading_status

ENABLED = os.environ.get("GPU_OFFLOAD_REAL_CLUSTER") == "1"
"""Set by tests/realcluster/run.sh: only then do the tests get their ``real`` half (the main suite never sees it,
whatever ``-m`` its lanes pass)."""
INDEX = int(os.environ.get("RC_INDEX", "0"))
"""env.sh's RC_INDEX: which of the clusters on this machine the tests use."""
STATE = Path(os.environ.get("RC_STATE", "/var/tmp/gpu-offload-realcluster" + (f"-{INDEX}" if INDEX else "")))
KUBECONFIG = STATE / "admin.kubeconfig"
REAL_NODES = (os.environ.get("RC_NODE", "donor-1-gpu"),
              *([os.environ.get("RC_NODE2", "donor-2-gpu")] if INDEX == 0 else
                [os.environ["RC_NODE2"]] if os.environ.get("RC_NODE2") else []))
"""The real kubelets' nodes, as env.sh names them: cluster 0 has two (RC_NODE and RC_NODE2), the others one
unless RC_NODE2 names a second (a copy of the real-cluster stage beside cluster 0)."""
KUBELETS = dict(zip(REAL_NODES, (("kubelet", "start_node"), ("kubelet-2", "start_node2")), strict=False))
"""Each real node's kubelet: its process's name in up.sh (``$RC_STATE/pids/<name>.pid``) and the stage that
starts it."""
HEALTHY = STATE / "healthy-gpus"  # env.sh's RC_HEALTHY: per node, how many of its fake GPUs are healthy
HOST_ADDRESS = f"10.219.{INDEX}.1"  # env.sh's RC_HOST_IP: the pods' bridge, where they reach this machine
KUEUE_PLURALS = ("workloads", "localqueues")
KUEUE_CLUSTER_PLURALS = ("clusterqueues", "resourceflavors", "workloadpriorityclasses", "cohorts")
LIQO = {"foreignclusters": ("core.liqo.io", None), "resourceslices": ("authentication.liqo.io", "ns"),
        "virtualnodes": ("offloading.liqo.io", "ns")}


def clusters() -> list[Any]:
    """Parameters of an ``origin`` fixture run on both clusters: ``sandbox`` always, ``real`` (marked
    ``real_cluster``) when the real-cluster stage runs."""
    return ["sandbox", *([pytest.param("real", marks=pytest.mark.real_cluster)] if ENABLED else [])]


@dataclass(frozen=True)
class RealCluster:
    """Where the real cluster's API is: its admin kubeconfig."""

    kubeconfig: Path

    def api_client(self) -> Any:
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))


@dataclass(frozen=True)
class RealOrigin:
    """The handle tests use for an origin, on the real cluster."""

    sandbox: RealCluster
    host_address: str = HOST_ADDRESS

    def live_processes(self) -> list[int]:
        """The sandbox reports container processes left alive; on the real cluster containerd owns them."""
        return []


TORCH_IMAGE = "localhost/gpuorc/python-torch:3.11"
"""The image with torch and numpy that tests/realcluster/torch_image.sh puts on every real node (not up.sh: about
4 GB; run.sh imports it with RC_TORCH_IMAGE=1, as CI's real-cluster stage does)."""
TORCH_REQUIRED = os.environ.get("RC_TORCH_IMAGE") == "1"
"""Set when the stage imported the torch image: a test that needs it then fails without it instead of skipping."""


def torch_image(client: Any, nodes: int = 1) -> str:
    """The torch image's name if the kubelets of the first ``nodes`` real nodes report it; else the test is skipped
    (failed when the stage was asked to import it), saying how."""
    core = kubernetes.client.CoreV1Api(client)
    if nodes > len(REAL_NODES):
        pytest.skip(f"needs {nodes} real nodes with the torch image; this cluster has {len(REAL_NODES)} "
                    "(RC_NODE2 gives clusters other than 0 a second one)")
    for node in REAL_NODES[:nodes]:
        if not any(TORCH_IMAGE in (image.names or []) for image in core.read_node(node).status.images or []):
            (pytest.fail if TORCH_REQUIRED else pytest.skip)(
                f"{TORCH_IMAGE} is not on {node}: run tests/realcluster/torch_image.sh first")
    return TORCH_IMAGE


@contextlib.contextmanager
def kueue_outage() -> Iterator[None]:
    """Kueue's process killed for the block, as when its pod dies (its webhooks then fail closed), and started
    again after it as up.sh starts it (``RC_STAGES=start_kueue``: until its webhooks answer)."""
    pid = int((STATE / "pids" / "kueue.pid").read_text())
    os.killpg(pid, signal.SIGTERM)

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    wait_until(gone, "Kueue's process gone", timeout=30, every=0.2)
    try:
        yield
    finally:
        started = subprocess.run(["bash", str(Path(__file__).with_name("up.sh"))], capture_output=True, text=True,
                                 env={**os.environ, "RC_STAGES": "start_kueue"}, check=False)
        if started.returncode:
            raise AssertionError(f"Kueue did not start again: {started.stdout[-2000:]}{started.stderr[-2000:]}")


@contextlib.contextmanager
def node_lost(node: str) -> Iterator[None]:
    """The node's kubelet killed for the block, as when a donor's peering or virtual kubelet dies: its containers
    run on and nobody reports them; Kubernetes' node controller marks the node unreachable after its grace period
    (50 s). After the block the kubelet starts again as up.sh starts it, and the node is Ready once more."""
    name, stage = KUBELETS[node]
    with RealCluster(KUBECONFIG).api_client() as client:
        gpus = (kubernetes.client.CoreV1Api(client).read_node_status(node).status.allocatable or {}).get("nvidia.com/gpu")
    pid = int((STATE / "pids" / f"{name}.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    try:
        yield
    finally:
        started = subprocess.run(["bash", str(Path(__file__).with_name("up.sh"))], capture_output=True, text=True,
                                 env={**os.environ, "RC_STAGES": stage}, check=False)
        if started.returncode:
            raise AssertionError(f"{node}'s kubelet did not start again: {started.stdout[-2000:]}{started.stderr[-2000:]}")
        with RealCluster(KUBECONFIG).api_client() as client:
            core = kubernetes.client.CoreV1Api(client)

            def ready() -> bool:
                status = core.read_node_status(node).status
                # Ready comes before the device plugin has registered with the new kubelet, which until then
                # offers no GPU: the node is back once it offers the GPUs it offered before
                back = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
                return back and (status.allocatable or {}).get("nvidia.com/gpu") == gpus
            wait_until(ready, f"{node} Ready again with its {gpus} GPUs", timeout=120, every=1.0)


def require_cluster() -> RealCluster:
    """The running cluster, or a failure saying how to start it (the lane never skips silently)."""
    if not KUBECONFIG.is_file():
        pytest.fail(f"no real cluster: {KUBECONFIG} is missing; start it with tests/realcluster/up.sh")
    return RealCluster(KUBECONFIG)


@contextlib.contextmanager
def seeded_origin(donors: Sequence[liqo.Donor], crds: Path, real_nodes: int | None = None) -> Iterator[RealOrigin]:
    """The real cluster with ``donors`` peered as Liqo would leave them, reset before and after. The first
    donors take the real kubelets' nodes (at most ``real_nodes`` of them: a donor that must have nothing behind
    its node, as a virtual kubelet's, comes after them); the others get nodes with nothing behind them."""
    cluster = require_cluster()
    reals = len(REAL_NODES) if real_nodes is None else min(real_nodes, len(REAL_NODES))
    with cluster.api_client() as client:
        install_crds(client, crds)
        reset(client)
        stop = threading.Event()
        fake_nodes = [d.node_name for d in donors[reals:]]
        for index, donor in enumerate(donors):
            _seed_donor(client, donor, index, real=index < reals)
        heartbeat = threading.Thread(target=_heartbeat, args=(cluster, fake_nodes, stop), daemon=True)
        heartbeat.start()
        try:
            yield RealOrigin(cluster)
        finally:
            stop.set()
            heartbeat.join()
            reset(client)


def _seed_donor(client: Any, donor: liqo.Donor, index: int, real: bool) -> None:
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    tenant, foreign, slice_, virtual, node = liqo.donor_objects(donor, index)
    core.create_namespace(tenant)
    for obj, plural in ((foreign, "foreignclusters"), (slice_, "resourceslices"), (virtual, "virtualnodes")):
        group, version = obj["apiVersion"].split("/")
        namespace = obj["metadata"].get("namespace")
        status = obj.pop("status", None)
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural, obj)
            if status:
                custom.patch_namespaced_custom_object_status(group, version, namespace, plural,
                                                             obj["metadata"]["name"], {"status": status})
        else:
            custom.create_cluster_custom_object(group, version, plural, obj)
            if status:
                custom.patch_cluster_custom_object_status(group, version, plural, obj["metadata"]["name"],
                                                          {"status": status})
    if real:
        real_node = REAL_NODES[index]
        if donor.node_name != real_node:
            raise ValueError(f"donor {index + 1}'s node is a real kubelet's, {real_node}; name the donor "
                             f"{real_node.removesuffix('-gpu')}")
        labels = {k: v for k, v in node["metadata"]["labels"].items() if not k.startswith("kubernetes.io/")}
        core.patch_node(real_node, {"metadata": {"labels": labels, "annotations": node["metadata"]["annotations"]},
                                    "spec": {"taints": node["spec"]["taints"]}})
        set_healthy_gpus(core, real_node, donor.gpus)
        return
    status = node.pop("status")
    core.create_node(node)
    _mark_ready(core, donor.node_name, status)


def set_healthy_gpus(core: Any, node: str, gpus: int | None) -> None:
    """Make ``gpus`` of the node's fake GPUs healthy (None: all) and wait until the kubelet reports them allocatable:
    the device plugin marks the rest Unhealthy, as NVIDIA's marks a GPU after an Xid error."""
    HEALTHY.mkdir(exist_ok=True)
    if gpus is None:
        (HEALTHY / node).unlink(missing_ok=True)
    else:
        (HEALTHY / node).write_text(f"{gpus}\n")

    def reported() -> bool:
        status = core.read_node_status(node).status
        allocatable = int(status.allocatable.get("nvidia.com/gpu", "0"))
        return allocatable == (int(status.capacity.get("nvidia.com/gpu", "0")) if gpus is None else gpus)
    wait_until(reported, f"{node} reporting {gpus if gpus is not None else 'all'} GPUs allocatable", timeout=60,
               every=0.5)


def _mark_ready(core: Any, name: str, status: dict[str, Any]) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for condition in status["conditions"]:
        condition["lastHeartbeatTime"] = condition["lastTransitionTime"] = now
    core.patch_node_status(name, {"status": status})


def _heartbeat(cluster: RealCluster, nodes: list[str], stop: threading.Event) -> None:
    """What Liqo's controllers keep doing for the peered donors: renew each fake node's Lease every 10 s, as a
    virtual kubelet does (the node controller marks a node Unknown after 40 s without one), and report each new
    or changed NamespaceOffloading ready for the clusters its selector picks (the sandbox's own builder)."""
    with cluster.api_client() as client:
        coordination = kubernetes.client.CoordinationV1Api(client)
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        renewed = 0.0
        while not stop.is_set():
            if time.monotonic() - renewed >= 10:
                _renew_leases(coordination, nodes)
                renewed = time.monotonic()
            _offload(custom, core, client)
            stop.wait(0.5)


def _renew_leases(coordination: Any, nodes: list[str]) -> None:
    now = datetime.now(UTC)
    for name in nodes:
        body = {"metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}}
        try:
            coordination.patch_namespaced_lease(name, "kube-node-lease", body)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            coordination.create_namespaced_lease("kube-node-lease", body)


def _offload(custom: Any, core: Any, client: Any) -> None:
    items = custom.list_cluster_custom_object("offloading.liqo.io", "v1beta1", "namespaceoffloadings")["items"]
    stale = [o for o in items if int((o.get("status") or {}).get("observedGeneration") or 0)
             < int(o["metadata"].get("generation") or 1)]
    if not stale:
        return
    nodes = [client.sanitize_for_serialization(n) for n in core.list_node().items]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for obj in stale:
        with contextlib.suppress(kubernetes.client.ApiException):  # deleted meanwhile
            custom.patch_namespaced_custom_object_status(
                "offloading.liqo.io", "v1beta1", obj["metadata"]["namespace"], "namespaceoffloadings",
                obj["metadata"]["name"], {"status": offloading_status(obj, nodes, now)})


def reset(client: Any) -> None:
    """Remove what a test module leaves: user namespaces, every Kueue object, the seeded Liqo objects and fake
    nodes, and the real nodes' Liqo labels, taint and unhealthy GPUs."""
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    doomed = [n.metadata.name for n in core.list_namespace().items
              if (n.metadata.labels or {}).get("gpu-offload.io/user-namespace") == "true"
              or n.metadata.name.startswith(("jhub-", "t-", "liqo-tenant-", "gpuo-test-"))]
    for name in doomed:
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespace(name, grace_period_seconds=0)
    for plural in KUEUE_CLUSTER_PLURALS:
        for obj in custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural)["items"]:
            with contextlib.suppress(kubernetes.client.ApiException):
                custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural, obj["metadata"]["name"])
    for obj in custom.list_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters")["items"]:
        custom.delete_cluster_custom_object("core.liqo.io", "v1beta1", "foreignclusters", obj["metadata"]["name"])
    for node in core.list_node().items:
        if node.metadata.name not in REAL_NODES:
            core.delete_node(node.metadata.name)
    for real_node in REAL_NODES:
        core.patch_node(real_node, {"metadata": {"labels": {
            liqo.TYPE_LABEL: None, liqo.REMOTE_CLUSTER_ID_LABEL: None, liqo.GPU_MODEL_LABEL: None,
            liqo.PRICE_KEY: None, "kubernetes.io/role": None, "type": None}, "annotations": {liqo.PRICE_KEY: None}},
            "spec": {"taints": None}})
        set_healthy_gpus(core, real_node, None)
    wait_until(lambda: not [n for n in core.list_namespace().items if n.metadata.name in doomed],
               "the previous module's namespaces deleted", timeout=120, every=0.5)
