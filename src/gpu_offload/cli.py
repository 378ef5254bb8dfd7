"""The ``gpu-offload`` command. Each sub-command lives in the package that owns it and registers here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (sub-command, module that defines `add_parser(subparsers)`): imported lazily so `gpu-offload --help`
# stays fast and a missing optional dependency only affects its own command.
COMMANDS: list[tuple[str, str]] = [
    ("quickstart", "gpu_offload.magics.quickstart"),
    ("clusters", "gpu_offload.liqo_peering.commands"),
    ("sandbox", "gpu_offload.sandbox.cli"),
    ("cleanup", "gpu_offload.magics.backends.kube.cli"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-offload",
        description="Run Jupyter cells and Metaflow steps on remote GPUs through Liqo.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _name, module_name in COMMANDS:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
