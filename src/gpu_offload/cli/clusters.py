"""``gpu-offload clusters``: the peered clusters, their virtual nodes and GPUs, read with your kubeconfig.

Lists Liqo-peered clusters, their GPU virtual nodes, free GPUs, models and prices. Reads ForeignClusters,
VirtualNodes, virtual Nodes and Pods cluster-wide with your kubeconfig.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ..liqo_peering.errors import GpuOffloadError


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``clusters`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("clusters", help=summary, description=__doc__)
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--json", action="store_true", help="print the records as JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the inventory; on failure print the error (it says what to do) and return 1."""
    from ..liqo_peering.client import LiqoClient, api_client_from_environment
    from ..liqo_peering.render import render_table

    try:
        inventory = LiqoClient(api_client_from_environment(args.context)).read_inventory()
    except GpuOffloadError as exc:
        print(f"gpu-offload clusters: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(dataclasses.asdict(inventory), indent=2))
    else:
        print(render_table(inventory))
    return 0
