"""Pure builders of a distributed run's objects: an Indexed Job of rank pods and the headless Service of rank 0.

``%%gpu_offload --nodes N`` runs the cell in N pods. They are one Indexed Job (completions = parallelism = N,
so pod ``i`` gets the index ``i`` as its node rank), because a Job is what Kueue admits as one unit and what
garbage collection deletes with its pods. Pod 0 hosts the rendezvous (torch's TCPStore) behind a headless
Service whose *short* name is ``MASTER_ADDR``: Liqo's default namespace mapping gives the namespace another
name on the donor side, so a fully qualified ``svc.<namespace>.svc.cluster.local`` would not resolve there,
while the search list of the pod's own namespace always completes a short name.

A distributed session (``spec.pod.session``) is the same Job whose pods run the runner with ``--session`` and
keep their stdin open: the backend attaches to each pod and sends every cell to all of them; each pod's
launcher passes it on to its ranks, which keep their state between cells.

Creation order, as for a single cell: the Job first (its pods wait in ContainerCreating for their Secret),
then :func:`~.specs.runner_secret` and :func:`master_service`, both owned by the Job, so deleting the Job with
``propagationPolicy: Background`` removes pods, Secret and Service together (a Job deleted without a policy
orphans its pods).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from . import labels as L
from .errors import InvalidRequest
from .specs import RunnerPodSpec, dns_name, owner_reference, queue_labels, runner_labels, runner_pod

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""The annotation (and, since Kubernetes 1.28, label) the Job controller gives each pod of an Indexed Job: its
index. The Service selects pod 0 by the label."""
PORT_RANGE = (20000, 30000)
"""Where :func:`master_port` picks from: unprivileged, below Linux's ephemeral range (32768-60999), so a
client socket never holds the port first."""
SHM_PER_PROCESS = 1024**3
"""Bytes of /dev/shm per rank process: NCCL's intra-node transport and DataLoader workers live there, and a
container's default /dev/shm is 64 MiB."""
SHM_VOLUME = "dshm"


@dataclass(frozen=True)
class RankJobSpec:
    """Everything that makes a distributed run's Job; ``pod`` is what each of its pods is, as for one cell."""

    pod: RunnerPodSpec
    """Image, user, scheduling (one donor's affinity: every pod lands there), env, memory, queue. Its
    ``timeout`` becomes the Job's activeDeadlineSeconds."""
    nodes: int
    """Pods, one per node rank."""
    procs_per_node: int
    """Rank processes per pod (one per GPU, or ``--procs-per-node`` for CPU ranks)."""
    master_port: int
    """Port of rank 0's rendezvous (see :func:`master_port`)."""
    shm_bytes: int | None = None
    """Size of the memory-backed /dev/shm; None: ``SHM_PER_PROCESS`` per rank process."""


def rank_job_name(run_id: str) -> str:
    """The Job's name for a run; its pods are ``<job>-<index>-<random>`` with hostname ``<job>-<index>``."""
    # the same name a single cell's pod gets, so the runner Secret (``<name>-runner``) and the sweep's selectors agree
    return dns_name(f"gpuo-{run_id}", "Job name (from run id)")


def master_service_name(run_id: str) -> str:
    """The headless Service in front of pod 0, whose short name is ``MASTER_ADDR``."""
    return dns_name(f"gpuo-{run_id}-rank0", "Service name (from run id)")


def master_port(run_id: str) -> int:
    """A port for the run's rendezvous, fixed by its run id (each retry of a run asks for the same one)."""
    low, high = PORT_RANGE
    return low + int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % (high - low)


def _check(spec: RankJobSpec) -> None:
    rank_job_name(spec.pod.run_id)  # a bad run id is named as the Job's, not as a pod's, name
    run = f"run {spec.pod.run_id}"
    if spec.nodes < 1:
        raise InvalidRequest(f"{run}: --nodes {spec.nodes}; ask for 1 or more pods")
    if spec.procs_per_node < 1:
        raise InvalidRequest(f"{run}: {spec.procs_per_node} processes per node; ask for 1 or more")
    if not 1024 <= spec.master_port <= 65535:
        raise InvalidRequest(f"{run}: MASTER_PORT {spec.master_port} is not an unprivileged port; use 1024-65535 "
                             "(master_port() picks one)")
    if spec.shm_bytes is not None and spec.shm_bytes < 1:
        raise InvalidRequest(f"{run}: /dev/shm of {spec.shm_bytes} bytes; give a positive size or none")


def rank_env(spec: RankJobSpec) -> list[dict[str, Any]]:
    """What every pod's container gets besides the runner's own variables.

    ``MASTER_ADDR``/``MASTER_PORT`` as ``env://`` reads them, and torchrun's own arguments as the ``PET_*``
    variables it reads when no flag is given, with the node rank from the pod's index annotation, so a plain
    ``torchrun script.py`` in the pod needs no flags. ``OMP_NUM_THREADS=1`` (as torchrun sets it for several
    processes) unless the run sets it: N processes each with a thread per core would oversubscribe the node.
    """
    address = master_service_name(spec.pod.run_id)
    plain = {
        "MASTER_ADDR": address, "MASTER_PORT": str(spec.master_port),
        "PET_MASTER_ADDR": address, "PET_MASTER_PORT": str(spec.master_port),
        "PET_NNODES": str(spec.nodes), "PET_NPROC_PER_NODE": str(spec.procs_per_node),
    }
    if "OMP_NUM_THREADS" not in spec.pod.env:
        plain["OMP_NUM_THREADS"] = "1"
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    # the annotation, as the job controller's own JOB_COMPLETION_INDEX reads it (the label is 1.28+)
    env.append({"name": "PET_NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}})
    return env


def _template(spec: RankJobSpec) -> dict[str, Any]:
    """The pod template: the runner pod of ``spec.pod`` with the ranks' environment and /dev/shm, built anew
    from it (the runner pod itself is left as :func:`~.specs.runner_pod` made it)."""
    pod = runner_pod(spec.pod)
    meta, pod_spec = pod["metadata"], pod["spec"]
    template_meta: dict[str, Any] = {"labels": runner_labels(spec.pod), "annotations": dict(meta["annotations"])}
    if meta.get("finalizers"):
        template_meta["finalizers"] = list(meta["finalizers"])
    first, *others = pod_spec["containers"]
    taken = {e["name"] for e in first["env"]}
    container = {**first, "env": [*first["env"], *(e for e in rank_env(spec) if e["name"] not in taken)],
                 "volumeMounts": [*first["volumeMounts"], {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]}
    shm = spec.shm_bytes if spec.shm_bytes is not None else SHM_PER_PROCESS * spec.procs_per_node
    volumes = [*pod_spec["volumes"], {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(shm)}}]
    # the deadline is the Job's (it ends every pod); queue labels are the Job's (Kueue admits the Job as a
    # whole; on the pods they would make Kueue's pod integration gate each one on its own)
    template_spec = {k: v for k, v in pod_spec.items() if k != "activeDeadlineSeconds"}
    return {"metadata": template_meta,
            "spec": {**template_spec, "containers": [container, *others], "volumes": volumes}}


def rank_job(spec: RankJobSpec) -> dict[str, Any]:
    """The Indexed Job running the run's pods: all or nothing (``backoffLimit: 0``, pods never restart).

    A rank that fails cannot rejoin a process group the others are in, so the first failed pod fails the Job
    and the job controller ends the other pods. With a queue, the Job carries Kueue's labels, and Kueue's Job
    webhook suspends it on creation: Kueue admits its N pods as one Workload and unsuspends it, never part of
    them. The Job is not created suspended by us: where Kueue does not manage it (Kueue absent or down with its
    webhook set to ignore, a namespace outside ``managedJobsNamespaceSelector``) it would wait for ever.
    """
    _check(spec)
    pod = spec.pod
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimit": 0,
        "template": _template(spec),
    }
    if pod.timeout is not None:
        job_spec["activeDeadlineSeconds"] = pod.timeout
    queue = queue_labels(pod)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": rank_job_name(pod.run_id),
            "namespace": dns_name(pod.namespace, "namespace"),
            "labels": {**runner_labels(pod), **queue},
            "annotations": {L.USER: pod.user, L.KERNEL: pod.kernel},
        },
        "spec": job_spec,
    }


def master_service(spec: RankJobSpec, job_uid: str) -> dict[str, Any]:
    """The headless Service selecting pod 0 of the run's Job (created, as ``job_uid``), owned by the Job.

    Headless: the name resolves to pod 0's own address, so the connection is pod to pod (no ClusterIP proxy
    between ranks). ``publishNotReadyAddresses``: the ranks rendezvous while they start, before any pod
    could be called ready, and DNS must not wait for readiness (as a StatefulSet's peer discovery does it).
    """
    job = rank_job_name(spec.pod.run_id)
    if not job_uid:
        raise InvalidRequest(f"Service for job {job}: no job uid; create the Job first and pass its uid")
    labels = runner_labels(spec.pod)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job}}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": master_service_name(spec.pod.run_id),
            "namespace": dns_name(spec.pod.namespace, "namespace"),
            "labels": labels,
            "ownerReferences": [owner_reference(owner, job_uid)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {L.MANAGED_BY: labels[L.MANAGED_BY], L.RUN_ID: labels[L.RUN_ID], INDEX_LABEL: "0"},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": spec.master_port, "targetPort": spec.master_port,
                       "protocol": "TCP"}],
        },
    }
