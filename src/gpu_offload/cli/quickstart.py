"""``gpu-offload quickstart``: the example notebook, unchanged, with its cells offloaded to Liqo donors.

By default it starts an embedded SANDBOX (an emulated origin cluster with two Liqo donors, Kueue and an S3
store, see ``gpu_offload.cli.embedded``), runs ``examples/quickstart.ipynb`` in a real kernel on the
kubernetes backend, and prints the cells' output as it streams, with the magic's line saying where each
offloaded cell ran (pod, virtual node, Liqo cluster, GPUs). Queueing is on: every cell goes through the
sandbox's Kueue, and one that asks for GPUs already taken waits in line, saying its place and Kueue's reason.
Everything it started is gone when it ends.
``--local`` runs the same notebook on the embedded local backend instead (no cluster at all).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``quickstart`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("quickstart", help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", action="store_true",
                        help="run the cells on the embedded local backend (runner processes, no cluster)")
    parser.add_argument("--notebook", type=Path, default=None, help="notebook to run (default: the example)")
    parser.add_argument("--output", type=Path, default=None, help="where to write the executed notebook")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """0 when every cell ran, 1 on a cell error, 2 when the notebook is missing."""
    from .notebook import default_notebook, execute

    source = args.notebook or default_notebook()
    if args.local or not source.is_file():
        return execute(source, args.output, args.timeout)
    from .embedded import embedded_cluster

    with embedded_cluster(queueing=True) as cluster:
        print(cluster.banner(), flush=True)
        status = execute(source, args.output, args.timeout, env=cluster.environment(os.environ))
    print("the sandbox stopped; nothing it started is left running", flush=True)
    return status


if __name__ == "__main__":
    from . import main

    sys.exit(main(["quickstart", *sys.argv[1:]]))
