"""A SANDBOX for ``gpu-offload quickstart`` and ``gpu-offload lab``: an emulated origin cluster with two Liqo
donors and an S3 store, both in this process (the API on 127.0.0.1, the store where pods reach it), and the kernel environment that points the
kubernetes backend at them.

- The cluster is the project's sandbox (``gpu_offload.sandbox``): the official Kubernetes client talks to it
  over HTTP, and pods bound to the donors' virtual nodes run as local processes. No GPU is real.
- Object storage is moto's S3 server (a real S3 API): the quickstart's 8 MB array is larger than a Secret
  holds, so it travels through a bucket as it would on a real cluster with ``GPU_OFFLOAD_S3_BUCKET`` set.
- The runner pods' image is :data:`IMAGE`. The sandbox runs any image whose name contains ``gpu-offload``
  with its own interpreter (``sandbox/kubelet/images.py``), which has numpy and matplotlib (the ``sandbox`` extra), so
  the example's figure is drawn. On a real cluster pick an image with the packages your cells import.
- The donors are trusted (``GPU_OFFLOAD_TRUSTED_CLUSTERS``): outputs come back as pickles, as from any
  cluster today. Donors are untrusted by default everywhere else (docs/security.md).

- With ``queueing`` (``gpu-offload quickstart`` and ``gpu-offload lab --hub``) the sandbox also emulates Kueue
  (``gpu_offload.sandbox.kueue``, its built-in description of Kueue's kinds), and each user's cells wait in line
  as on a cluster. Under ``lab --hub`` the hub's queue controller writes the flavors, the ClusterQueue and the
  priority classes from the donors; without a hub the sandbox writes them once at start, with the LocalQueue of
  its namespace, by the reconcile ``gpu-offload queues sync --namespace quickstart`` runs.

Everything stops when the ``with`` block ends: the API server, the pods' processes and the S3 server.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..liqo_peering import environment as E
from ..liqo_peering import labels as L
from ..liqo_peering.kueue import QueueSettings, desired, gpu_quotas
from ..sandbox.apiserver.resources import ResourceType
from ..sandbox.liqo import seed as liqo
from ..sandbox.liqo.origin import RunningOrigin, running_origin
from ..sandbox.objectstore import s3_server

NAMESPACE = "quickstart"
IMAGE = "gpu-offload/quickstart:sandbox"
BUCKET = "gpu-offload-quickstart"
DONORS = liqo.donors(2, gpus=4, gpu_model="A100")
# moto accepts any credentials; these keep the kernel from looking for real ones
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sandbox", "AWS_SECRET_ACCESS_KEY": "sandbox",
                  "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class Embedded:
    """A running sandbox and S3 store, and how a kernel reaches them."""

    kubeconfig: Path
    api_url: str
    s3_endpoint: str
    host_address: str
    """Where pods reach this machine (``RunningOrigin.host_address``): servers they call listen there."""
    namespace: str = NAMESPACE
    queueing: bool = False
    """Whether the sandbox emulates Kueue (see :func:`embedded_cluster`)."""
    queue: QueueSettings | None = None
    """The queue the kernels' cells wait in, when the sandbox wrote it (no hub gives one to the kernels)."""

    def kernel_env(self) -> dict[str, str]:
        """The variables that make a kernel's ``%%gpu_offload`` cells run on this sandbox."""
        settings = E.assignments({
            E.BACKEND: "kubernetes", E.NAMESPACE: self.namespace, E.IMAGE: IMAGE,
            E.S3_BUCKET: BUCKET, E.S3_ENDPOINT: self.s3_endpoint,
            E.TRUSTED_CLUSTERS: ",".join(d.cluster_id for d in DONORS),
            E.QUEUE: self.queue.local_queue if self.queue else None,
            E.PRIORITY: self.queue.default_priority if self.queue else None,
        })
        return {"KUBECONFIG": str(self.kubeconfig), **S3_CREDENTIALS, **settings}

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (this process's environment) with :meth:`kernel_env`, and without the caller's own project
        and AWS settings: a ``GPU_OFFLOAD_SERVICE_URL`` or an ``AWS_PROFILE`` meant for a real deployment must
        not steer the sandbox's kernels."""
        kept = {k: v for k, v in base.items() if not k.startswith(("GPU_OFFLOAD_", "AWS_"))}
        return {**kept, **self.kernel_env()}

    def banner(self) -> str:
        """What the user is told before anything runs: that this is a sandbox, and what is in it."""
        donors = ", ".join(f"{d.cluster_id} ({d.gpus} x {d.gpu_model}, virtual node {d.node_name})" for d in DONORS)
        return (
            "SANDBOX: an emulated origin cluster with two Liqo donors, running in this process on this machine.\n"
            "  No real cluster and no real GPU: pods bound to the donors' virtual nodes run as local processes.\n"
            f"  donors     {donors}; trusted for this run\n"
            f"  API        {self.api_url}   (KUBECONFIG={self.kubeconfig})\n"
            f"  namespace  {self.namespace}\n"
            f"  storage    s3://{BUCKET} on moto's S3 server at {self.s3_endpoint}\n"
            + (f"  queueing   Kueue emulated (no real Kueue): {self._queue_words()}; cells wait in line when "
               "the GPUs they ask for are taken\n" if self.queueing else "")
            + "  It stops, with everything it started, when this command ends."
        )


    def _queue_words(self) -> str:
        if self.queue is None:
            return "the hub writes its ClusterQueue from the donors"
        return (f"ClusterQueue {self.queue.cluster_queue} over both donors, LocalQueue {self.queue.local_queue} in "
                f"{self.namespace}, priority classes {', '.join(c.name for c in self.queue.priority_classes)} "
                f"(default {self.queue.default_priority})")


def _create_namespace(origin: RunningOrigin, name: str, queued: bool) -> None:
    import kubernetes

    client = origin.sandbox.api_client()
    # the project's ClusterQueue admits only from namespaces labelled as a hub labels its users'
    labels = {L.USER_NAMESPACE: "true"} if queued else {}
    try:
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": name, "labels": labels}})
    finally:
        client.close()


QUEUE_START_SECONDS = 30.0
"""How long the sandbox's donors get to show their granted GPUs before the queue is written without them."""


def _write_queue(origin: RunningOrigin, namespace: str) -> QueueSettings:
    """Kueue's objects for the donors and ``namespace``'s LocalQueue, as ``gpu-offload queues sync`` writes them;
    raises naming the conflict when one cannot be written."""
    from ..liqo_peering.client import LiqoClient
    from ..liqo_peering.queue_client import KueueClient
    from ..liqo_peering.queue_sync import reconcile

    settings = QueueSettings()
    client = origin.sandbox.api_client()
    try:
        liqo = LiqoClient(client)
        deadline = time.monotonic() + QUEUE_START_SECONDS
        while True:  # a quota written before the virtual nodes show their GPUs would admit nothing
            wanted = desired(liqo.read_inventory(), liqo.trust, settings, [namespace])
            if sum(gpu_quotas(wanted.cluster_queue).values()) >= sum(d.gpus for d in DONORS) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        result = reconcile(KueueClient(client), wanted)
    finally:
        client.close()
    if result.conflicts:
        raise RuntimeError(f"the sandbox's queue could not be written: {'; '.join(result.conflicts)}")
    return settings


# Built-in kinds the hub's spawner hook writes that the sandbox does not serve yet: stored, validated and listed
# as plain objects, which is all the hook needs (RBAC and network policies are not enforced by the sandbox).
HUB_KINDS = (ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "rolebinding"),
             ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, "networkpolicy"))


def _serve_hub_kinds(origin: RunningOrigin) -> None:
    registry = origin.sandbox.api.registry
    for kind in HUB_KINDS:
        if registry.by_kind(f"{kind.group}/{kind.version}", kind.kind) is None:
            registry.add(kind)


@contextmanager
def _origin(root: Path, queueing: bool) -> Iterator[RunningOrigin]:
    # in_cluster_api: a program in a pod (a user's server) finds the API as on a cluster
    if not queueing:
        with running_origin(root, DONORS, in_cluster_api=True) as origin:
            yield origin
        return
    from ..sandbox.kueue.testing import running_kueue_origin

    with running_kueue_origin(root, DONORS, in_cluster_api=True) as (origin, _):
        yield origin


@contextmanager
def embedded_cluster(workdir: Path | None = None, queueing: bool = False, hub: bool = False) -> Iterator[Embedded]:
    """Start the sandbox (with Kueue when ``queueing``) and the S3 store for the ``with`` block (in ``workdir``,
    else a temporary folder). With ``queueing`` and no ``hub`` the sandbox writes the queue itself; with a
    ``hub`` its queue controller does."""
    with tempfile.TemporaryDirectory(prefix="gpu-offload-sandbox-") as temporary:
        root = workdir or Path(temporary)
        # pods have their own network when the sandbox runs as root: the store listens where they reach it
        with _origin(root, queueing) as origin, s3_server(origin.host_address, [BUCKET]) as endpoint:
            _serve_hub_kinds(origin)
            _create_namespace(origin, NAMESPACE, queueing)
            queue = _write_queue(origin, NAMESPACE) if queueing and not hub else None
            yield Embedded(origin.sandbox.kubeconfig, origin.sandbox.url, endpoint, origin.host_address,
                           queueing=queueing, queue=queue)
