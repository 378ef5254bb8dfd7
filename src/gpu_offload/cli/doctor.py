"""``gpu-offload doctor``: checks the setup the kubernetes backend needs, one line each, with the fix.

kubeconfig (and that the API answers), namespace (exists), NamespaceOffloading (the namespace is offloaded, with
pods kept home unless placed by gpu-offload), reflection (Secrets and ConfigMaps Liqo would copy to donors),
kueue (with queueing on, whether Liqo copies Kueue's queue-name label to donor pods),
object storage, inventory (virtual nodes and free GPUs), trust (which donors the origin trusts with pickled
outputs: ``liqo_peering.trust``). Each line is OK, WARN (runs work, with a limit) or
FAIL (runs cannot work until fixed); the exit code is 1 when a line fails. Without any cluster setting it
says that runs use the local backend and how to point them at a cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    status: str
    """``OK``, ``WARN`` or ``FAIL``."""
    what: str
    text: str
    """What was found, and for WARN and FAIL what to do."""


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``doctor`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("doctor", help=summary, description=__doc__)
    parser.add_argument("--json", action="store_true",
                        help='one JSON object, for scripts: {"checks": [{"status", "what", "text"}], "failed": N}')
    parser.set_defaults(func=run)


def check_offloading(namespace: str, offloading: dict[str, Any] | None, creates: bool) -> Check:
    """The NamespaceOffloading line (pure)."""
    if offloading is None:
        if creates:
            return Check("WARN", "offloading", f"namespace {namespace} is not offloaded yet; the first run creates "
                         "its NamespaceOffloading (your account needs the right to create it)")
        return Check("FAIL", "offloading", f"namespace {namespace} has no NamespaceOffloading, so pods cannot "
                     "leave the cluster: ask your admin, or set GPU_OFFLOAD_CREATE_OFFLOADING=1 to create it")
    from ..liqo_peering.offloading import offloading_state

    strategy = (offloading.get("spec") or {}).get("podOffloadingStrategy", "?")
    state = offloading_state(offloading, ())
    if state.failed:
        return Check("FAIL", "offloading", f"NamespaceOffloading in phase {state.phase}: check the peering "
                     "(gpu-offload clusters) and its clusterSelector")
    if strategy != "Local":
        return Check("WARN", "offloading", f"namespace {namespace} is offloaded with podOffloadingStrategy {strategy}: "
                     "any pod of it (a Metaflow step without @gpu_offload, a Dask worker) may be scheduled on a donor, "
                     "untrusted ones included; ask your admin to set it to Local (gpu-offload's own pods carry "
                     "their placement and still go; the hub sets Local at your next server start)")
    return Check("OK", "offloading", f"namespace {namespace} is offloaded ({strategy}, phase {state.phase})")


def reflected_user_data(objects: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """``Kind/name`` of the Secrets and ConfigMaps that Liqo, under its default reflection (DenyList), copies to
    every donor of an offloaded namespace and that may hold user data (pure). Left out: objects marked
    ``liqo.io/skip-reflection``, service-account tokens (never reflected), the cluster's public CA bundle, and
    gpu-offload's runner Secrets (marked for reflection; they hold the runner archive only)."""
    from ..liqo_peering import labels as L

    found = []
    for kind, obj in objects:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        skip = annotations.get(L.SKIP_REFLECTION)
        if (skip is not None and str(skip).lower() != "false") or obj.get("type") == "kubernetes.io/service-account-token":
            continue
        if kind == "ConfigMap" and meta.get("name") == "kube-root-ca.crt":
            continue
        ours = (meta.get("labels") or {}).get(L.MANAGED_BY) == L.MANAGED_BY_VALUE
        if ours and str(annotations.get(L.ALLOW_REFLECTION, "")).lower() == "true":
            continue
        found.append(f"{kind}/{meta.get('name')}")
    return sorted(found)


def check_reflection(namespace: str, found: list[str] | None) -> Check:
    """The reflection line (pure): ``found`` from :func:`reflected_user_data`, None when it could not be listed."""
    if found is None:
        return Check("WARN", "reflection", f"cannot list the Secrets of {namespace}, so whether Liqo copies user data "
                     "to donors is unknown; ask your admin")
    if not found:
        return Check("OK", "reflection", f"no Secret or ConfigMap of {namespace} that Liqo would copy to donors "
                     "holds user data")
    return Check("WARN", "reflection", f"Liqo copies {', '.join(found)} of {namespace} to every donor the namespace "
                 "is offloaded to, untrusted ones included (Liqo's default reflection): annotate each "
                 "liqo.io/skip-reflection=true (kubectl annotate secret NAME liqo.io/skip-reflection=true), or ask "
                 "your admin to set Liqo's offloading.reflection.secret.type=AllowList on the origin")


def unreflected_kueue_labels(virtual_nodes: list[dict[str, Any]]) -> list[str]:
    """Names of the VirtualNodes whose virtual kubelet copies Kueue's queue-name label to the donor's pods
    (pure): Liqo reflects every label of an offloaded pod but those in the VirtualNode's
    ``spec.offloadingPatch.labelsNotReflected``, which Liqo fills from its chart's
    ``offloading.reflection.skip.labels`` (empty by default)."""
    from ..liqo_peering import labels as L

    found = []
    for vn in virtual_nodes:
        patch = (vn.get("spec") or {}).get("offloadingPatch") or {}
        if L.QUEUE_NAME_LABEL not in (patch.get("labelsNotReflected") or []):
            found.append(str((vn.get("metadata") or {}).get("name")))
    return sorted(found)


def check_label_reflection(queue: str | None, found: list[str]) -> Check | None:
    """The Kueue label line (pure), for a user whose runs are queued: ``found`` from
    :func:`unreflected_kueue_labels`; None when runs are not queued (the label is never written)."""
    if queue is None:
        return None
    if not found:
        return Check("OK", "kueue", "Liqo keeps kueue.x-k8s.io/queue-name off donor pods")
    return Check("WARN", "kueue", f"Liqo copies the label kueue.x-k8s.io/queue-name of queued runs to the "
                 f"donor's pod (virtual node(s) {', '.join(found)}): a donor whose own Kueue manages the namespace "
                 "gates the pod for ever (it has no LocalQueue of that name). Ask your admin to install Liqo with "
                 "--set offloading.reflection.skip.labels='{kueue.x-k8s.io/queue-name,kueue.x-k8s.io/priority-class}'"
                 " (docs/hub.md)")


def check_inventory(inventory: Any) -> Check:
    """The virtual nodes and GPUs line (pure)."""
    nodes = inventory.virtual_nodes
    if not nodes:
        return Check("FAIL", "inventory", "no Liqo virtual node: peer a donor cluster (liqoctl peer) and grant it "
                     "a ResourceSlice with nvidia.com/gpu; `gpu-offload clusters` shows what is peered")
    usable = [vn for vn in nodes if vn.ready and not vn.cordoned]
    free = sum(vn.free for vn in usable)
    text = (f"{len(inventory.clusters)} cluster(s), {len(nodes)} virtual node(s), "
            f"{sum(vn.capacity for vn in nodes)} GPU(s), {free} free")
    if not free:
        return Check("WARN", "inventory", f"{text}: runs asking for a GPU wait or fail; --gpus 0 runs on CPU")
    return Check("OK", "inventory", text)


def check_trust(inventory: Any, variable: str) -> Check:
    """The trust line (pure): donors not trusted send outputs back only as plain types."""
    trusted = [c.cluster_id for c in inventory.clusters if c.trusted]
    untrusted = [c.cluster_id for c in inventory.clusters if not c.trusted]
    if not untrusted:
        return Check("OK", "trust", f"every peered cluster is trusted ({', '.join(trusted) or 'none peered'})")
    return Check("WARN", "trust", f"{', '.join(untrusted)} not trusted: runs there send outputs back only as plain "
                 f"types. If the origin trusts their admins, list them in {variable} (a hub sets it from its chart's "
                 "clusters values)")


def check_storage(bucket: str | None, probe: Callable[[], None]) -> Check:
    """The object storage line; ``probe`` reaches the bucket and raises if it cannot."""
    if not bucket:
        return Check("WARN", "storage", "no object storage: bundles over about 1 MB (a big workdir) and large "
                     "outputs cannot travel, and a --noblock run's log is lost if its follower dies; set "
                     "GPU_OFFLOAD_S3_BUCKET (and GPU_OFFLOAD_S3_ENDPOINT)")
    try:
        probe()
    except Exception as exc:  # noqa: BLE001 - boto3 raises many kinds; the sentence names it
        return Check("FAIL", "storage", f"bucket {bucket} cannot be reached: {exc}; check GPU_OFFLOAD_S3_ENDPOINT "
                     "and the AWS credentials in your environment")
    return Check("OK", "storage", f"bucket {bucket} is reachable")


def cluster_checks(env: dict[str, str]) -> list[Check]:
    """Every check, stopping at the first that makes the next meaningless."""
    from ..engine.backends.kube import config
    from ..liqo_peering import environment as E
    from ..liqo_peering.client import LiqoClient, api_client_from_environment
    from ..liqo_peering.errors import GpuOffloadError

    where = env.get("KUBECONFIG") or "~/.kube/config"
    try:
        api = api_client_from_environment()
        settings = config.from_environment(env)
    except GpuOffloadError as exc:
        return [Check("FAIL", "kubeconfig", str(exc))]
    except Exception as exc:  # noqa: BLE001 - BackendNotConfigured and a bad policy name say what to set
        return [Check("OK", "kubeconfig", f"{where} loads"), Check("FAIL", "namespace", str(exc))]
    import kubernetes

    core = kubernetes.client.CoreV1Api(api)
    try:
        core.read_namespace(settings.namespace, _request_timeout=15)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            return [Check("FAIL", "kubeconfig", f"{where}: the API server answered {exc.status} {exc.reason}")]
        return [Check("OK", "kubeconfig", f"{where} reaches {api.configuration.host}"),
                Check("FAIL", "namespace", f"namespace {settings.namespace} does not exist: kubectl create "
                      f"namespace {settings.namespace} (or fix GPU_OFFLOAD_NAMESPACE)")]
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, TLS: all mean the same to the user
        return [Check("FAIL", "kubeconfig", f"{where}: the API server at {api.configuration.host} cannot be "
                      f"reached ({type(exc).__name__}); is the cluster up and the context right?")]
    liqo = LiqoClient(api, request_timeout=15)
    checks = [Check("OK", "kubeconfig", f"{where} reaches {api.configuration.host}"),
              Check("OK", "namespace", f"{settings.namespace} exists")]
    try:
        offloading = liqo.read_offloading(settings.namespace)
        checks.append(check_offloading(settings.namespace, offloading, settings.create_offloading))
        if offloading is not None:
            checks.append(check_reflection(settings.namespace, _reflected(core, settings.namespace)))
        inventory = liqo.read_inventory()  # the origin's trust policy applied (GPU_OFFLOAD_TRUSTED_CLUSTERS)
        checks += [check_inventory(inventory), check_trust(inventory, E.TRUSTED_CLUSTERS.name)]
        labels = check_label_reflection(_queue(api, settings.namespace, settings.queue),
                                        unreflected_kueue_labels(list(liqo.list("VirtualNode").items)))
        checks += [labels] if labels else []
    except GpuOffloadError as exc:
        checks.append(Check("FAIL", "liqo", f"{exc}"))
    checks.append(check_storage(settings.storage.bucket if settings.storage else None, lambda: _probe(settings)))
    return checks


def _queue(api: Any, namespace: str, configured: str | None) -> str | None:
    """The LocalQueue runs wait in: the configured one, else the namespace's first (as the kernel finds it at
    its first launch); None when runs are not queued or LocalQueues cannot be listed."""
    if configured:
        return configured
    import kubernetes

    from ..liqo_peering import labels as L

    try:
        listed = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
            L.LOCAL_QUEUE.group, L.LOCAL_QUEUE.version, namespace, L.LOCAL_QUEUE.plural, _request_timeout=15)
    except Exception:  # noqa: BLE001 - no Kueue (404), no right to list (403): nothing queued that we can see
        return None
    items = listed.get("items") or []
    return str(items[0]["metadata"]["name"]) if items else None


def _reflected(core: Any, namespace: str) -> list[str] | None:
    """What :func:`reflected_user_data` finds in the namespace; ConfigMaps only where the account may list them
    (a user's server may not, nor write any); None when Secrets cannot be listed."""
    import kubernetes

    objects: list[tuple[str, dict[str, Any]]] = []
    for kind, lister in (("Secret", core.list_namespaced_secret), ("ConfigMap", core.list_namespaced_config_map)):
        try:
            listed = lister(namespace, _request_timeout=15, _preload_content=False)
        except kubernetes.client.ApiException:
            if kind == "Secret":
                return None
            continue
        import json

        objects += [(kind, item) for item in json.loads(listed.data).get("items", [])]
    return reflected_user_data(objects)


def _probe(settings: Any) -> None:
    from ..engine.backends.kube.storage import RunStorage

    storage = RunStorage(settings.storage, settings.user)
    storage.client.head_bucket(Bucket=settings.storage.bucket)


def run(args: argparse.Namespace) -> int:
    """Print the report; 1 when a line failed."""
    from ..engine.backends.kube.config import configured
    from ..liqo_peering import environment as E

    env = dict(os.environ)
    if not configured(env) and not env.get("KUBECONFIG"):
        checks = [Check("OK", "backend", "no cluster configured: runs use the local backend (this machine). For a "
                                         f"cluster: export KUBECONFIG=PATH {E.NAMESPACE.name}=NAMESPACE")]
    else:
        checks = cluster_checks(env)
    failed = [c for c in checks if c.status == "FAIL"]
    if getattr(args, "json", False):
        print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks], "failed": len(failed)}, indent=2))
        return 1 if failed else 0
    for check in checks:
        print(f"{check.status:<5} {check.what:<11} {check.text}")
    if failed:
        print(f"{len(failed)} check(s) failed: fix them from the top, then run gpu-offload doctor again",
              file=sys.stderr)
    return 1 if failed else 0
