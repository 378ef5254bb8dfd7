"""``gpu-offload cleanup``: delete runner pods and Secrets a kernel left on the cluster (after a crash, say).

Deletes the runner pods and Secrets of a user (and one kernel) by their labels, e.g. after a kernel was killed
while a cell ran. Uses KUBECONFIG (or the in-cluster account).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from ..liqo_peering import environment as E
from ..liqo_peering.settings import kernel_settings


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``cleanup`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("cleanup", help=summary, description=__doc__)
    parser.add_argument("--namespace", default=kernel_settings().namespace, help=f"default: ${E.NAMESPACE.name}, else the kubeconfig context's")
    parser.add_argument("--user", default=os.environ.get("JUPYTERHUB_USER") or getpass.getuser(),
                        help="whose runners (default: $JUPYTERHUB_USER, else your login)")
    parser.add_argument("--kernel", default=None, help="only this kernel's runners (default: all kernels)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Delete and list what was deleted; 1 with a sentence on stderr when the cluster cannot be reached."""
    from ..engine.backends.kube.pods import PodApi
    from ..liqo_peering.client import api_client_from_environment, kubeconfig_namespace
    from ..liqo_peering.errors import GpuOffloadError
    from ..liqo_peering.specs import runner_selector

    # the kernels' own fallback: the kubeconfig context's namespace, as kubectl
    args.namespace = args.namespace or kubeconfig_namespace(os.environ.get("KUBECONFIG"))
    if not args.namespace:
        print(f"gpu-offload cleanup: no namespace; pass --namespace, set {E.NAMESPACE.name}, or point KUBECONFIG "
              "at a kubeconfig whose context names one", file=sys.stderr)
        return 2
    try:
        removed = PodApi(api_client_from_environment(), args.namespace).delete_matching(
            runner_selector(args.user, args.kernel))
    except GpuOffloadError as exc:
        print(f"gpu-offload cleanup: {exc}", file=sys.stderr)
        return 1
    for name in sorted(removed):
        print(f"deleted {name}")
    print(f"{len(removed)} object(s) of user {args.user} removed from namespace {args.namespace}")
    return 0
