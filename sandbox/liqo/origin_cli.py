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

from ..arguments import TRUSTED_ENV
from ..kubelet.images import DEFAULT_MAP
from ..server import Plugin
from . import seed as liqo
from .origin import LiqoOrigin, OriginOptions


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
        if args.trusted:
            raise SystemExit(f"gpu-offload sandbox: --trusted {', '.join(args.trusted)}: there are no donors to "
                             "trust; add --donors N")
        return []
    prices = tuple(p.strip() for p in args.prices.split(",") if p.strip())
    try:
        donors = liqo.donors(args.donors, args.gpus, args.gpu_model, prices)
    except ValueError as exc:
        raise SystemExit(f"gpu-offload sandbox: {exc}") from exc
    ids = [d.cluster_id for d in donors]
    unknown = [t for t in args.trusted if t not in ids]
    if unknown:
        raise SystemExit(f"gpu-offload sandbox: --trusted {', '.join(unknown)}: no such donor; the donors are "
                         f"{', '.join(ids)}")
    state = args.state_dir
    if state is None:
        state = Path(tempfile.mkdtemp(prefix="gpu-offload-sandbox-"))
        atexit.register(shutil.rmtree, state, True)
    if not 0 < args.backoff <= args.max_backoff:
        raise SystemExit("gpu-offload sandbox: --backoff must be positive and at most --max-backoff")
    origin = LiqoOrigin(OriginOptions(state, donors, _image_map(args.image), args.backoff, args.max_backoff,
                                      tuple(args.tool_dir), args.field_validation))
    print("SANDBOX origin cluster with Liqo donors (emulated; no real cluster, no real GPU):", flush=True)
    for donor in donors:
        print(f"  {donor.cluster_id}: node {donor.node_name}, {donor.gpus} x {donor.gpu_model}, "
              f"{donor.price_per_gpu_hour} per GPU-hour, "
              f"{'trusted' if donor.cluster_id in args.trusted else 'untrusted'}", flush=True)
    # a donor cannot make itself trusted: only this line, run on the origin's side, does
    trusted = ",".join(t for t in ids if t in args.trusted)
    if trusted:
        print(f"  trust them in your shell: export {TRUSTED_ENV}={trusted}", flush=True)
    return [origin.plugin]
