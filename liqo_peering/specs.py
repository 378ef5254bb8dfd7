"""Pure builders of the objects the project writes: no network here, only dicts in API shape.

Built like kubespawner's ``objects.py``: a backend or the hub calls these, then one client call sends the
result. Tests compare them with literal dicts and validate them against the real schemas.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import environment as E
from . import labels as L
from .errors import BundleTooLarge, InvalidRequest
from .selectors import selector_matches

MOUNT_PATH = "/gpu-offload"
RUNNER_KEY = "runner.pyz"
# The API server caps a Secret's data at 1 MiB; leave room for metadata. A bundle that makes more than this
# together with the runner goes through object storage (it used to share the Secret with the runner).
MAX_SECRET_BYTES = 1024 * 1024 - 16 * 1024
REFLECTED = {L.ALLOW_REFLECTION: "true"}
"""Annotations of what must reach the donor a pod runs on (the runner archive, no user data): copied by Liqo
under its default DenyList and under an AllowList alike."""
NOT_REFLECTED = {L.SKIP_REFLECTION: "true"}
"""Annotations of every other Secret or ConfigMap the project writes in a user namespace: Liqo would copy it to
every donor the namespace is offloaded to, trusted or not (under an AllowList it is not copied anyway)."""
BUNDLE_URL_ENV = E.BUNDLE_URL.name
# Downloads the bundle into an unlinked temporary file and runs the runner on it through /dev/fd, so the
# bundle (it holds the frame nonce) never sits in a named file and nothing is left behind in the image.
# The bundle's sha256 (argv[2], set by the kernel in the pod spec) must match: anyone else who can write to
# the bucket could have replaced the object, and the bundle is code the runner executes.
BOOTSTRAP = (
    "import hashlib,os,sys,tempfile,urllib.request\n"
    "f=tempfile.TemporaryFile();h=hashlib.sha256()\n"
    f"with urllib.request.urlopen(os.environ.pop('{BUNDLE_URL_ENV}'),timeout=300) as r:\n"
    "    while True:\n"
    "        b=r.read(1<<20)\n"
    "        if not b: break\n"
    "        f.write(b);h.update(b)\n"
    "if h.hexdigest()!=sys.argv[2]:\n"
    "    sys.exit('gpu-offload runner: the bundle in object storage is not the one the kernel uploaded (sha256 '"
    "+h.hexdigest()+'); another writer of the bucket replaced it; nothing ran')\n"
    "f.flush();os.lseek(f.fileno(),0,0);os.set_inheritable(f.fileno(),True)\n"
    "os.execv(sys.executable,[sys.executable,sys.argv[1],'--bundle','/dev/fd/%d'%f.fileno()])\n"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


SESSION_GRACE_SECONDS: int = E.SESSION_NOTICE.default
"""A session pod's termination grace period unless the hub sets another (``GPU_OFFLOAD_SESSION_NOTICE``): enough
for its runner to upload a checkpoint of a few GiB."""
NODE_LOST_SECONDS: int = E.NODE_LOST_SECONDS.default
"""Runner pods' toleration of a not-ready or unreachable node (``GPU_OFFLOAD_NODE_LOST_SECONDS``)."""

def label_value(text: str) -> str:
    """``text`` as a valid label value: unchanged when it already is one, else cleaned plus a short hash.

    User names like ``alice@example.org`` are not label values; the hash keeps two users who clean to
    the same text apart. The raw text goes into an annotation beside it.
    """
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:54].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def dns_name(text: str, what: str) -> str:
    """``text`` when it is a DNS label (an object's name or namespace), else an error naming ``what`` it is."""
    if len(text) > 63 or not _DNS_LABEL.match(text):
        raise InvalidRequest(
            f"{what} {text!r} is not a DNS label: use lowercase letters, digits and '-', at most 63 characters"
        )
    return text


# --- NamespaceOffloading ------------------------------------------------------------------------------


NO_CLUSTER = ("",)
"""``cluster_ids`` that select no cluster at all (a namespace that reaches no donor)."""


def cluster_selector(cluster_ids: Sequence[str] | None) -> dict[str, Any]:
    """A clusterSelector over Liqo virtual nodes: all of them, those of the given clusters, or none
    (:data:`NO_CLUSTER`)."""
    exprs: list[dict[str, Any]] = [{"key": L.TYPE_LABEL, "operator": "In", "values": [L.TYPE_VIRTUAL_NODE]}]
    if cluster_ids is not None and tuple(cluster_ids) == NO_CLUSTER:
        exprs.append({"key": L.REMOTE_CLUSTER_ID_LABEL, "operator": "DoesNotExist"})
    elif cluster_ids:
        exprs.append({"key": L.REMOTE_CLUSTER_ID_LABEL, "operator": "In", "values": sorted(set(cluster_ids))})
    return {"nodeSelectorTerms": [{"matchExpressions": exprs}]}


def namespace_offloading(
    namespace: str, cluster_ids: Sequence[str] | None = None, strategy: str = "Local"
) -> dict[str, Any]:
    """The NamespaceOffloading that lets the project's pods of ``namespace`` reach the given clusters (all when
    None).

    ``Local`` keeps every other pod of the namespace on the origin: Liqo's pod webhook then adds no toleration
    and no affinity (``pkg/webhooks/pod/mutations.go`` of liqotech/liqo; its webhook only sees namespaces
    labelled ``liqo.io/scheduling-enabled``, which Liqo sets for Remote and LocalAndRemote only), while the
    namespace is still created on every selected donor. The project's own pods carry the toleration and the
    node affinity of their placement themselves (``placement.scheduling_fragment``), so they still go; a
    Metaflow step without ``@gpu_offload`` or a Dask worker does not. namespaceMappingStrategy is left to
    Liqo's default: it cannot change once set, so we never pick it.
    """
    if strategy not in ("Local", "Remote", "LocalAndRemote"):
        raise InvalidRequest(f"podOffloadingStrategy {strategy!r}: use Local, Remote or LocalAndRemote")
    return {
        "apiVersion": L.NAMESPACE_OFFLOADING.api_version,
        "kind": L.NAMESPACE_OFFLOADING.kind,
        "metadata": {
            "name": L.NAMESPACE_OFFLOADING_NAME,
            "namespace": dns_name(namespace, "namespace"),
            "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE},
        },
        "spec": {"podOffloadingStrategy": strategy, "clusterSelector": cluster_selector(cluster_ids)},
    }


def _virtual_node_labels(cluster_id: str) -> dict[str, str]:
    return {L.TYPE_LABEL: L.TYPE_VIRTUAL_NODE, L.REMOTE_CLUSTER_ID_LABEL: cluster_id}


def merge_offloading(
    existing: Mapping[str, Any],
    cluster_ids: Sequence[str],
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any] | None:
    """The existing NamespaceOffloading widened so it also selects ``cluster_ids``; None if it already does.

    Terms of a NodeSelector are ORed, so appending a term for the missing clusters selects them without
    dropping any cluster the old terms selected (others' pods rely on those). ``node_labels`` maps a
    cluster id to its virtual node's labels when known, so terms on other labels (a GPU model, say) are
    judged correctly. Only the clusterSelector changes; metadata (resourceVersion: the update is
    optimistic) and namespaceMappingStrategy are kept as they are.
    """
    spec = existing.get("spec") or {}
    # any strategy: the project's pods carry their own toleration and affinity, so Local (what the project
    # writes) lets them go, and a namespace someone made LocalAndRemote or Remote is theirs to keep
    selector = spec.get("clusterSelector") or {}
    terms = list(selector.get("nodeSelectorTerms") or [])
    if not terms:
        return None  # Liqo reads an absent or empty selector as "every peered cluster"
    missing = [
        cid
        for cid in sorted(set(cluster_ids))
        if not selector_matches(selector, (node_labels or {}).get(cid) or _virtual_node_labels(cid))
    ]
    if not missing:
        return None
    merged = copy.deepcopy(dict(existing))
    merged["spec"]["clusterSelector"] = {
        "nodeSelectorTerms": terms + cluster_selector(missing)["nodeSelectorTerms"]
    }
    return merged


# --- ResourceSlice ------------------------------------------------------------------------------------


def gpu_resource_slice(
    name: str,
    tenant_namespace: str,
    consumer_cluster_id: str,
    provider_cluster_id: str,
    gpus: int,
    cpu: str | None = None,
    memory: str | None = None,
) -> dict[str, Any]:
    """A ResourceSlice asking a donor for ``gpus`` GPUs, as ``liqoctl create resourceslice`` writes it: labelled
    for Liqo's replication to the provider (which grants it) and annotated so that Liqo gives the granted slice
    its own virtual node.

    ``cpu`` and ``memory`` ride along because the pods using the GPUs need some; Liqo recommends a
    separate slice for GPUs so they get a node of their own that can carry the model labels.
    """
    if gpus < 1:
        raise InvalidRequest(f"ResourceSlice {name}: gpus={gpus}; ask for 1 or more")
    provider = dns_name(provider_cluster_id, "provider cluster id")
    resources: dict[str, str] = {L.GPU_RESOURCE: str(gpus)}
    if cpu:
        resources["cpu"] = cpu
    if memory:
        resources["memory"] = memory
    return {
        "apiVersion": L.RESOURCE_SLICE.api_version,
        "kind": L.RESOURCE_SLICE.kind,
        "metadata": {
            "name": dns_name(name, "ResourceSlice name"),
            "namespace": dns_name(tenant_namespace, "tenant namespace"),
            "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE, L.REMOTE_CLUSTER_ID_LABEL: provider,
                       L.REPLICATION_LABEL: "true", L.REPLICATION_DESTINATION_LABEL: provider},
            "annotations": {L.CREATE_VIRTUAL_NODE: "true"},
        },
        "spec": {
            "class": "default",
            "consumerClusterID": dns_name(consumer_cluster_id, "consumer cluster id"),
            "providerClusterID": provider,
            "resources": resources,
        },
    }


# --- the runner Pod and its Secret --------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerPodSpec:
    """Everything that makes one runner pod; the backend fills it from the OffloadRequest and placement."""

    run_id: str
    """DNS-label-safe id of the run; names the pod and the Secret."""
    namespace: str
    image: str
    user: str
    kernel: str
    scheduling: Mapping[str, Any]
    """``NodeChoice.scheduling_fragment()``: container resources, pod tolerations and affinity."""
    timeout: int | None = None
    """Seconds before Kubernetes stops the pod (activeDeadlineSeconds); None for no limit."""
    python: str = "python3"
    """Interpreter in the image that runs the runner zipapp."""
    session: bool = False
    """A warm session pod reading commands on stdin instead of running one bundle."""
    env: Mapping[str, str] = field(default_factory=dict)
    cpu: str | None = None
    """CPU request (a quantity)."""
    memory: str | None = None
    """Memory request and limit (a quantity): the runner is OOM-killed at what placement counted on."""
    bundle_url: str | None = None
    """A presigned URL of a bundle too large for the Secret: the pod fetches it with :data:`BOOTSTRAP`."""
    bundle_sha256: str = ""
    """The sha256 of the bundle at ``bundle_url``, which the pod checks before running it."""
    run_as_user: int = 1000
    """Stock images often default to root, which restricted pods may not be; any uid works for the runner."""
    server: str | None = None
    """The Jupyter server the kernel runs under, when known: its orphan sweep selects on it."""
    kernel_pid: int | None = None
    """The kernel's process id, written beside ``server``."""
    metered: bool = False
    """Carry the hub meter's finalizer (only where a hub meter runs to remove it)."""
    cli: bool = False
    """Made by ``gpu-offload run``, not by a kernel: labelled so, which keeps the orphan sweep off it."""
    queue: str | None = None
    """The Kueue LocalQueue the pod waits in (label ``kueue.x-k8s.io/queue-name``); None: not queued."""
    priority_class: str | None = None
    """The Kueue WorkloadPriorityClass of the pod (label ``kueue.x-k8s.io/priority-class``); needs ``queue``."""
    node_lost_seconds: int = NODE_LOST_SECONDS
    """Seconds the pod tolerates its node being not ready or unreachable before Kubernetes evicts it
    (:func:`node_lost_tolerations`)."""
    session_notice: int = SESSION_GRACE_SECONDS
    """With ``session``: the pod's termination grace period, the time its runner has from SIGTERM to write the
    session's checkpoint."""
    preimport: tuple[str, ...] = ()
    """Modules a one-shot runner imports while the kernel attaches to write its bundle (the runner's
    ``--preimport``)."""


def node_lost_tolerations(seconds: int) -> list[dict[str, Any]]:
    """How long a runner pod stays bound to a node Kubernetes marked not ready or unreachable (a donor whose
    peering or virtual kubelet stopped answering: about 50 s of silence, the node controller's grace period)
    before Kubernetes' taint eviction deletes it. Without these, Kubernetes' DefaultTolerationSeconds admission
    gives every pod 300 s: a run on a lost donor would hang five minutes before the engine could retry it
    elsewhere or say it was lost. A short blip is already absorbed by the node controller's grace period."""
    if seconds < 0:
        raise InvalidRequest(f"node-lost toleration of {seconds} s: give 0 seconds or more")
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in (L.NODE_NOT_READY_TAINT, L.NODE_UNREACHABLE_TAINT)]


def runner_pod_name(run_id: str) -> str:
    """The pod's name for a run (its runner Secret is ``<pod>-runner``)."""
    return dns_name(f"gpuo-{run_id}", "pod name (from run id)")


def runner_labels(spec: RunnerPodSpec) -> dict[str, str]:
    """Labels identifying who and what a pod or Secret belongs to: cleanup selects on them."""
    labels = {
        L.MANAGED_BY: L.MANAGED_BY_VALUE,
        L.USER: label_value(spec.user),
        L.KERNEL: label_value(spec.kernel),
        L.RUN_ID: label_value(spec.run_id),
    }
    if spec.cli:
        labels[L.ORIGIN] = L.ORIGIN_CLI
    if spec.server:
        labels[L.SERVER] = label_value(spec.server)
        if spec.kernel_pid is not None:
            labels[L.KERNEL_PID] = str(spec.kernel_pid)
    return labels


def runner_selector(user: str | None = None, kernel: str | None = None, run_id: str | None = None,
                    server: str | None = None) -> str:
    """Label selector for what the project created, narrowed to a user, a kernel, a run or a Jupyter server.

    Cleanup after a crashed kernel lists pods and Secrets with ``runner_selector(user, kernel)``; values go
    through ``label_value`` exactly as the builders wrote them, so a user like ``alice@example.org`` matches.
    """
    parts = [f"{L.MANAGED_BY}={L.MANAGED_BY_VALUE}"]
    for key, value in ((L.USER, user), (L.KERNEL, kernel), (L.RUN_ID, run_id), (L.SERVER, server)):
        if value is not None:
            parts.append(f"{key}={label_value(value)}")
    return ",".join(parts)


def _command(spec: RunnerPodSpec) -> list[str]:
    runner = f"{MOUNT_PATH}/{RUNNER_KEY}"
    if spec.session:
        return [spec.python, runner, "--session"]
    if spec.bundle_url is not None:
        return [spec.python, "-I", "-c", BOOTSTRAP, runner, spec.bundle_sha256]
    # the bundle (code, inputs, nonce) comes on stdin from the kernel, to this pod only: in the Secret, Liqo
    # would copy it to every donor the namespace is offloaded to; the slow imports start while it is on its way
    ahead = ["--preimport", ",".join(spec.preimport)] if spec.preimport else []
    return [spec.python, runner, "--bundle", "-", *ahead]


def _resources(spec: RunnerPodSpec) -> dict[str, Any]:
    resources = copy.deepcopy(dict(spec.scheduling.get("resources") or {}))
    requests = {k: v for k, v in (("cpu", spec.cpu), ("memory", spec.memory)) if v}
    if requests:
        resources["requests"] = {**resources.get("requests", {}), **requests}
    if spec.memory:
        resources["limits"] = {**resources.get("limits", {}), "memory": spec.memory}
    return resources


def _container(spec: RunnerPodSpec) -> dict[str, Any]:
    # HOME: a non-root uid in a stock image has no home directory, and libraries want one.
    env = {"HOME": "/tmp", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **spec.env}
    if spec.bundle_url is not None:
        env[BUNDLE_URL_ENV] = spec.bundle_url
    container: dict[str, Any] = {
        "name": "runner",
        "image": spec.image,
        "command": _command(spec),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": _resources(spec),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "runner", "mountPath": MOUNT_PATH, "readOnly": True}],
    }
    if spec.session:
        container.update(stdin=True, stdinOnce=False, tty=False)
    elif spec.bundle_url is None:
        # one attach writes the bundle; its end closes the runner's stdin (the runner reads to end of input)
        container.update(stdin=True, stdinOnce=True, tty=False)
    return container


def queue_labels(spec: RunnerPodSpec) -> dict[str, str]:
    """Kueue's labels of ``spec``'s pod (or Job): with a queue name Kueue's webhook gates it until admitted."""
    if spec.queue is None:
        if spec.priority_class is not None:
            raise InvalidRequest(f"run {spec.run_id}: priority class {spec.priority_class!r} but no queue: queueing "
                                 "through Kueue is off here, so leave --priority out (or ask the admin to turn it on)")
        return {}
    labels = {L.QUEUE_NAME_LABEL: dns_name(spec.queue, "Kueue queue")}
    if spec.priority_class is not None:
        labels[L.PRIORITY_CLASS_LABEL] = dns_name(spec.priority_class, "Kueue priority class")
    return labels


def runner_pod(spec: RunnerPodSpec) -> dict[str, Any]:
    """The Pod running the runner zipapp from its Secret, at the "restricted" pod security level.

    Its bundle comes on stdin (:func:`_command`), or from a presigned URL when it is large; the Secret holds
    only the runner archive.
    """
    if spec.timeout is not None and spec.timeout < 1:
        raise InvalidRequest(f"run {spec.run_id}: timeout={spec.timeout}s; give 1 second or more, or none")
    if not spec.image:
        raise InvalidRequest(f"run {spec.run_id}: no image; pass --image or set the default image")
    name = runner_pod_name(spec.run_id)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # a session's runner writes its state on SIGTERM (preemption, drain): the time to finish writing it
        "terminationGracePeriodSeconds": spec.session_notice if spec.session else 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": spec.run_as_user,
            "runAsGroup": spec.run_as_user,
            "fsGroup": spec.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec)],
        # 0o444: the runner's uid is not the Secret's owner, so it needs read for everyone.
        "volumes": [{"name": "runner", "secret": {"secretName": runner_secret_name(name), "defaultMode": 0o444}}],
    }
    for key in ("tolerations", "affinity"):
        if spec.scheduling.get(key):
            pod_spec[key] = copy.deepcopy(spec.scheduling[key])
    pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *node_lost_tolerations(spec.node_lost_seconds)]
    if spec.timeout is not None:
        pod_spec["activeDeadlineSeconds"] = spec.timeout
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": dns_name(spec.namespace, "namespace"),
            "labels": {**runner_labels(spec), **queue_labels(spec)},
            "annotations": {L.USER: spec.user, L.KERNEL: spec.kernel},
            **({"finalizers": [L.METERED_FINALIZER]} if spec.metered else {}),
        },
        "spec": pod_spec,
    }


def check_secret_size(run_id: str, bundle_bytes: int, runner_bytes: int) -> None:
    """Raise ``BundleTooLarge`` when bundle and runner cannot travel in one Secret.

    Call it before creating the pod: the Secret is built after the pod (it needs the pod's uid), and a
    pod whose Secret never comes would be left waiting in ContainerCreating.
    """
    size = bundle_bytes + runner_bytes
    if size > MAX_SECRET_BYTES:
        raise BundleTooLarge(
            f"run {run_id}: bundle ({bundle_bytes} bytes) plus runner ({runner_bytes} bytes) is {size} bytes, more"
            f" than a Secret holds ({MAX_SECRET_BYTES}); configure S3-compatible object storage for the kubernetes"
            " backend, or pass smaller inputs"
        )


def runner_secret_name(owner_name: str) -> str:
    """The runner Secret of a pod or Job."""
    return f"{owner_name}-runner"


def runner_secret(owner: Mapping[str, Any], owner_uid: str, runner: bytes) -> dict[str, Any]:
    """The Secret holding the runner archive, owned by ``owner`` (created first) so it is deleted with it.

    ``owner`` is the runner Pod of one cell, or the Job of a distributed one (``rankjob.rank_job``): the
    Secret is named after it either way. Its pods wait in ContainerCreating until the Secret exists, which is
    what allows this order. It holds no user data, and is marked for Liqo to reflect (:data:`REFLECTED`):
    the pod mounts it on whichever donor runs it. The bundle never goes in here.
    """
    meta = owner["metadata"]
    check_secret_size(str(meta["labels"].get(L.RUN_ID)), 0, len(runner))
    if not owner_uid:
        kind = str(owner["kind"]).lower()
        raise InvalidRequest(f"Secret for {kind} {meta['name']}: no {kind} uid; create the {kind} first and pass its uid")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": runner_secret_name(str(meta["name"])),
            "namespace": meta["namespace"],
            "labels": dict(meta["labels"]),
            "annotations": dict(REFLECTED),
            "ownerReferences": [owner_reference(owner, owner_uid)],
        },
        "data": {RUNNER_KEY: base64.b64encode(runner).decode("ascii")},
    }


def owner_reference(owner: Mapping[str, Any], owner_uid: str) -> dict[str, str]:
    """An ownerReference to ``owner`` (a built object, created since as ``owner_uid``): garbage collection
    deletes the dependent once the owner is gone."""
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner_uid}
