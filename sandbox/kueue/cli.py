"""``gpu-offload sandbox --kueue``: the plugin factory of the sandbox command (its options: ``sandbox/arguments.py``)."""

from __future__ import annotations

import argparse
import dataclasses

from ..server import Plugin
from . import Kueue, KueueOptions


def plugins(args: argparse.Namespace) -> list[Plugin]:
    """The Kueue plugin when ``--kueue`` is given (none otherwise)."""
    timeout = args.kueue_pods_ready_timeout
    excluded = tuple(args.kueue_exclude_resource_prefix)
    if not args.kueue:
        if timeout is not None or excluded:
            raise SystemExit("gpu-offload sandbox: --kueue-pods-ready-timeout and --kueue-exclude-resource-prefix "
                             "are Kueue's settings: each needs --kueue")
        return []
    if timeout is not None and timeout < 0:
        raise SystemExit(f"gpu-offload sandbox: --kueue-pods-ready-timeout {timeout}: give a number of seconds "
                         "(0 turns waitForPodsReady off)")
    print("SANDBOX Kueue emulated (no real Kueue): create ResourceFlavors, a ClusterQueue and LocalQueues to "
          "queue pods labelled kueue.x-k8s.io/queue-name", flush=True)
    options = KueueOptions(exclude_resource_prefixes=excluded)
    if timeout is not None:
        options = dataclasses.replace(options, pods_ready_timeout=timeout or None)
    return [Kueue(options).plugin]
