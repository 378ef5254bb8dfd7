"""The ``gpu-offload sandbox`` options: what the emulated clusters look like. Only argparse and pathlib here, so
``gpu-offload sandbox --help`` builds its parser without importing the sandbox (or its extra's packages)."""

from __future__ import annotations

import argparse
from pathlib import Path

TRUSTED_ENV = "GPU_OFFLOAD_TRUSTED_CLUSTERS"
"""The origin-side setting the project reads (liqo_peering/trust.py); named here, the sandbox imports nothing."""


def add_donor_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the donor options to the ``sandbox`` sub-command."""
    parser.add_argument("--gpus", type=int, default=4, help="GPUs each donor lends (default 4)")
    parser.add_argument("--gpu-model", default="A100", help="GPU model label of every donor (default A100)")
    parser.add_argument("--prices", default="",
                        help="comma-separated price per GPU-hour, one per donor (default 2.00, 2.25, ...)")
    parser.add_argument("--image", action="append", default=[], metavar="PATTERN=TARGET",
                        help="map images matching PATTERN (fnmatch) to 'project', 'stock', 'torch' or an "
                             "interpreter path; checked before the defaults; repeatable")
    parser.add_argument("--tool-dir", action="append", default=[], type=Path, metavar="DIR",
                        help="also look here for tools hub images carry (configurable-http-proxy); repeatable")
    parser.add_argument("--backoff", type=float, default=0.5, metavar="SECONDS",
                        help="first restart and image-pull back-off, doubled up to --max-backoff "
                             "(default 0.5; a kubelet uses 10)")
    parser.add_argument("--field-validation", choices=("Warn", "Ignore", "Strict"), default="Warn",
                        help="what a write without fieldValidation does with unknown fields (default Warn, as "
                             "kube-apiserver: dropped, named in a Warning header)")
    parser.add_argument("--max-backoff", type=float, default=5.0, metavar="SECONDS",
                        help="back-off ceiling (default 5; a kubelet uses 300)")
    parser.add_argument("--trusted", action="append", default=[], metavar="CLUSTER_ID",
                        help="a donor the origin trusts (e.g. donor-1); repeatable. Trust is origin-side "
                             f"configuration: the sandbox prints the {TRUSTED_ENV} line to export")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where pod folders live (default: a temporary folder removed at exit)")


def add_kueue_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--kueue`` and its settings to the ``sandbox`` sub-command."""
    parser.add_argument("--kueue", action="store_true",
                        help="emulate Kueue (queueing, fair sharing, preemption); serve Kueue's real CRDs with "
                             "--crds ../shared/kueue-crds, else a built-in description")
    parser.add_argument("--kueue-pods-ready-timeout", type=float, default=None, metavar="SECONDS",
                        help="Kueue's waitForPodsReady timeout (default: 1800, on as since Kueue 0.19; 0: off)")
    parser.add_argument("--kueue-exclude-resource-prefix", action="append", default=[], metavar="PREFIX",
                        help="Kueue's resources.excludeResourcePrefixes (may be given more than once), e.g. "
                             "ephemeral-storage, which Metaflow's step pods request and the project's ClusterQueue "
                             "does not cover")
