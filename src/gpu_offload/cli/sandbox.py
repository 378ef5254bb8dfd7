"""``gpu-offload sandbox``: serve an emulated Kubernetes API on 127.0.0.1 until interrupted.

The parser's options come from ``sandbox/arguments.py`` (argparse only), so ``gpu-offload sandbox --help`` imports
none of the sandbox; serving imports it, and its plugins come from :func:`plugin_factories`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..sandbox import arguments

if TYPE_CHECKING:  # the sandbox (and its extra's packages) is imported only to serve, never for --help
    from ..sandbox.server import Plugin

BANNER = """\
================================================================================
 SANDBOX: an emulated Kubernetes API for trying gpu-offload without a cluster.
 Nothing here is a real cluster; no real GPU is used. Stop it with Ctrl-C.
 API        {url}
 kubeconfig {kubeconfig}
================================================================================"""
# The project's variables, spelled here (the sandbox imports nothing of the project). With them, cells run on
# the kubernetes backend in the kubeconfig context's namespace (``default``), offloaded on first use.
BACKEND_EXPORTS = """\
 Cells and flows use these donors after, in the shell that starts Jupyter:
   export KUBECONFIG={kubeconfig}
   export GPU_OFFLOAD_BACKEND=kubernetes"""


def plugin_factories() -> list[Callable[[argparse.Namespace], list[Plugin]]]:
    """(args) -> plugins: the Liqo donors of --donors/--gpus, and Kueue with --kueue."""
    from ..sandbox.kueue import cli as kueue_cli
    from ..sandbox.liqo import origin_cli

    return [origin_cli.plugins, kueue_cli.plugins]


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """Options describing the emulated clusters (part 2 extends this group)."""
    parser.add_argument("--donors", type=int, default=0,
                        help="number of Liqo donor clusters to emulate (0: the bare API)")
    arguments.add_donor_arguments(parser)  # --gpus, --gpu-model, --prices, --image, --state-dir, ...
    arguments.add_kueue_arguments(parser)


def add_parser(subparsers: Any, summary: str) -> argparse.ArgumentParser:
    """Register ``gpu-offload sandbox``."""
    parser = subparsers.add_parser("sandbox", help=summary, description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True,
                        help="where to write the kubeconfig (written once the API answers)")
    parser.add_argument("--crds", type=Path, action="append", default=[],
                        help="folder of CustomResourceDefinition YAMLs to serve; repeatable (Liqo's and Kueue's)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    add_topology_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _check_args(args: argparse.Namespace) -> str | None:
    if args.donors < 0:
        return f"--donors {args.donors}: give 0 or more donor clusters"
    for folder in args.crds:
        if not folder.is_dir():
            return f"--crds {folder}: no such folder; pass a folder of CRD YAML manifests"
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: give a port between 1 and 65535, or 0 for a free one"
    return None


async def _serve(args: argparse.Namespace) -> int:
    from ..sandbox.apiserver.kubeconfig import write_kubeconfig
    from ..sandbox.server import ApiServer
    from ..sandbox.testing import make_api

    plugins = [p for factory in plugin_factories() for p in factory(args)]
    try:
        api = make_api(args.crds)
    except (ValueError, yaml.YAMLError) as exc:
        print(f"gpu-offload sandbox: --crds {' '.join(map(str, args.crds))}: {exc}", file=sys.stderr)
        return 2
    server = ApiServer(api, port=args.port, plugins=plugins)
    await server.start()
    try:
        # the kubeconfig appears only once the API really answers, so waiting on the file is enough
        await asyncio.to_thread(urllib.request.urlopen, f"{server.url}/version", timeout=10)
        try:
            write_kubeconfig(args.kubeconfig, server.url)
        except OSError as exc:
            print(f"gpu-offload sandbox: cannot write the kubeconfig to {args.kubeconfig} ({exc}); "
                  "give --kubeconfig a path in a writable folder", file=sys.stderr)
            return 1
        print(BANNER.format(url=server.url, kubeconfig=args.kubeconfig), flush=True)
        if args.donors > 0:
            print(BACKEND_EXPORTS.format(kubeconfig=args.kubeconfig.resolve()), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await server.stop()
    print("sandbox stopped", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; exit 2 with a message on bad arguments."""
    problem = _check_args(args)
    if problem:
        print(f"gpu-offload sandbox: {problem}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(args))
    except OSError as exc:
        print(f"gpu-offload sandbox: cannot serve on 127.0.0.1:{args.port} ({exc}); pick another --port "
              "or 0", file=sys.stderr)
        return 1
