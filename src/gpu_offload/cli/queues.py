"""``gpu-offload queues``: Kueue's view of the pool, and ``queues sync`` to make it follow the Liqo inventory.

Without a hub, the same reconcile the hub's controller runs: ResourceFlavors per donor and GPU model, the
ClusterQueue with their quota, the WorkloadPriorityClasses, and a LocalQueue in ``--namespace``.
Settings come from the hub's configuration file (``--config``, else ``GPU_OFFLOAD_CONFIG``) when there is one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..liqo_peering import environment as E
from ..liqo_peering import labels as L
from ..liqo_peering.errors import GpuOffloadError

if TYPE_CHECKING:  # building the parser imports no client code (gpu-offload --help stays fast)
    from ..liqo_peering.kueue import QueueSettings
    from ..liqo_peering.trust import TrustPolicy


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``queues`` (and ``queues sync``) on the ``gpu-offload`` command."""
    parser = subparsers.add_parser(
        "queues", help=summary,
        description="Show the ClusterQueue of the GPU pool: flavors in the order Kueue tries them, their quota and "
        "usage, pending and admitted workloads, priority classes. `queues sync` makes Kueue's objects follow the "
        "Liqo inventory.")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--config", type=Path, help=f"the hub's configuration file (default: ${E.HUB_CONFIG.name})")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    parser.set_defaults(func=run_show)
    actions = parser.add_subparsers(dest="queues_command", metavar="ACTION")
    sync = actions.add_parser("sync", help="create or update flavors, the ClusterQueue and priority classes",
                              description="Create or update the ResourceFlavors (one per donor and GPU model), the "
                              "ClusterQueue and the WorkloadPriorityClasses from the Liqo inventory; delete the "
                              "flavors of donors that are gone. Idempotent.")
    # also after `sync`; SUPPRESS keeps a value given before it (a subparser's default would overwrite it)
    sync.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context (default: the current one)")
    sync.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="the hub's configuration file")
    sync.add_argument("--namespace", action="append", default=[], metavar="NS",
                      help="also create the LocalQueue in NS (may be given more than once)")
    sync.add_argument("--dry-run", action="store_true", help="print the changes without writing anything")
    sync.set_defaults(func=run_sync)


def load_settings(path: Path | None) -> tuple[QueueSettings, TrustPolicy | None]:
    """Queue settings and the admin's per-cluster policy from the hub's configuration file, else defaults."""
    import os

    import yaml

    from ..liqo_peering.kueue import QueueSettings, queue_settings
    from ..liqo_peering.settings import hub_config_path
    from ..liqo_peering.trust import policy_from_config

    chosen = path or hub_config_path(os.environ)
    if not chosen:
        return QueueSettings(), None
    try:
        raw = yaml.safe_load(Path(chosen).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise GpuOffloadError(f"configuration {chosen} cannot be read: {exc}; pass --config a readable file") from exc
    queueing = (raw.get("queueing") or {}) if isinstance(raw, Mapping) else {}
    try:
        settings = queue_settings(queueing.get("kueue") if isinstance(queueing, Mapping) else None)
        policy = policy_from_config(raw.get("clusters")) if raw.get("clusters") else None
    except ValueError as exc:
        raise GpuOffloadError(f"configuration {chosen}: {exc}") from None
    return settings, policy


def _label_notes(client: Any, namespaces: Sequence[str]) -> list[str]:
    notes = []
    for ns in namespaces:
        found = client.namespace_labels(ns)
        if found is None:
            raise GpuOffloadError(f"namespace {ns} does not exist: create it first, or leave --namespace out")
        if found.get(L.USER_NAMESPACE) != "true":
            notes.append(f"namespace {ns} lacks the label {L.USER_NAMESPACE}=true, so the ClusterQueue does not "
                         f"admit from it: kubectl label namespace {ns} {L.USER_NAMESPACE}=true")
    return notes


def run_sync(args: argparse.Namespace) -> int:
    """Reconcile once; print what changed (or would), conflicts and warnings."""
    from ..liqo_peering.client import LiqoClient, api_client_from_environment
    from ..liqo_peering.kueue import desired
    from ..liqo_peering.queue_client import KueueClient
    from ..liqo_peering.queue_sync import reconcile

    try:
        settings, policy = load_settings(args.config)
        api_client = api_client_from_environment(args.context)
        liqo = LiqoClient(api_client, trust=policy)
        client = KueueClient(api_client)
        notes = _label_notes(client, args.namespace)
        wanted = desired(liqo.read_inventory(), liqo.trust, settings, args.namespace)
        result = reconcile(client, wanted, dry_run=args.dry_run)
    except GpuOffloadError as exc:
        print(f"gpu-offload queues sync: {exc}", file=sys.stderr)
        return 1
    prefix = "would " if args.dry_run and result.changes else ""
    for line in str(result).splitlines():
        print(prefix + line if not line.startswith(("conflict", "warning", "nothing")) else line)
    for note in notes:
        print(f"note: {note}")
    return 1 if result.conflicts else 0


def run_show(args: argparse.Namespace) -> int:
    """Print the ClusterQueue's flavors, quota, usage and workload counts."""
    from ..liqo_peering.client import api_client_from_environment
    from ..liqo_peering.queue_client import KueueClient
    from ..liqo_peering.queue_view import queue_records, render_queues

    try:
        settings, _ = load_settings(args.config)
        client = KueueClient(api_client_from_environment(args.context))
        queues = [q for q in client.list("ClusterQueue") if q["metadata"]["name"] == settings.cluster_queue]
        shown = (settings.cluster_queue, queues[0] if queues else None, client.list("ResourceFlavor"),
                 client.list("WorkloadPriorityClass"), client.list("LocalQueue"))
        text = json.dumps(queue_records(*shown), indent=2) if args.json else render_queues(*shown)
    except GpuOffloadError as exc:
        print(f"gpu-offload queues: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0
