"""``gpu-offload doctor``: checks the setup the kubernetes backend needs, one line each, with the fix.

kubeconfig (and that the API answers), namespace (exists), NamespaceOffloading (the namespace is offloaded),
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
    return Check("OK", "offloading", f"namespace {namespace} is offloaded ({strategy}, phase {state.phase})")


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
        checks.append(check_offloading(settings.namespace, liqo.read_offloading(settings.namespace),
                                       settings.create_offloading))
        inventory = liqo.read_inventory()  # the origin's trust policy applied (GPU_OFFLOAD_TRUSTED_CLUSTERS)
        checks += [check_inventory(inventory), check_trust(inventory, E.TRUSTED_CLUSTERS.name)]
    except GpuOffloadError as exc:
        checks.append(Check("FAIL", "liqo", f"{exc}"))
    checks.append(check_storage(settings.storage.bucket if settings.storage else None, lambda: _probe(settings)))
    return checks


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
