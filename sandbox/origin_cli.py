"""The ``gpu-offload sandbox`` options of part 2: donors, their GPUs, model and prices, and the image map.

``gpu-offload sandbox --donors 2 --gpus 4 --gpu-model A100 --kubeconfig PATH [--crds DIR]`` serves an
origin with two Liqo donors whose pods really run as local processes. ``--donors 0`` keeps part 1's bare
API (no Liqo, no scheduler, no kubelet).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
from pathlib import Path

from . import liqo
from .images import DEFAULT_MAP
from .origin import LiqoOrigin, OriginOptions
from .server import Plugin


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the donor options to the ``sandbox`` sub-command."""
    parser.add_argument("--gpus", type=int, default=4, help="GPUs each donor lends (default 4)")
    parser.add_argument("--gpu-model", default="A100", help="GPU model label of every donor (default A100)")
    parser.add_argument("--prices", default="",
                        help="comma-separated price per GPU-hour, one per donor (default 2.00, 2.25, ...)")
    parser.add_argument("--image", action="append", default=[], metavar="PATTERN=TARGET",
                        help="map images matching PATTERN (fnmatch) to 'project', 'stock' or an interpreter "
                             "path; checked before the defaults; repeatable")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where pod folders live (default: a temporary folder removed at exit)")


def _image_map(entries: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for entry in entries:
        pattern, sep, target = entry.partition("=")
        if not sep or not pattern or not target:
            raise SystemExit(f"gpu-offload sandbox: --image {entry!r}: write PATTERN=TARGET, "
                             "e.g. --image 'myorg/*=stock'")
        pairs.append((pattern, target))
    return (*pairs, *DEFAULT_MAP)


def plugins(args: argparse.Namespace) -> list[Plugin]:
    """The Liqo origin plugin for ``args`` (none for ``--donors 0``)."""
    if args.donors <= 0:
        return []
    prices = tuple(p.strip() for p in args.prices.split(",") if p.strip())
    try:
        donors = liqo.donors(args.donors, args.gpus, args.gpu_model, prices)
    except ValueError as exc:
        raise SystemExit(f"gpu-offload sandbox: {exc}") from exc
    state = args.state_dir
    if state is None:
        state = Path(tempfile.mkdtemp(prefix="gpu-offload-sandbox-"))
        atexit.register(shutil.rmtree, state, True)
    origin = LiqoOrigin(OriginOptions(state, donors, _image_map(args.image)))
    print("SANDBOX origin cluster with Liqo donors (emulated; no real cluster, no real GPU):", flush=True)
    for donor in donors:
        print(f"  {donor.cluster_id}: node {donor.node_name}, {donor.gpus} x {donor.gpu_model}, "
              f"{donor.price_per_gpu_hour} per GPU-hour", flush=True)
    return [origin.plugin]
