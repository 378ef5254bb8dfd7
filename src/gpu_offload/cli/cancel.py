"""``gpu-offload cancel RUN``: stop a run as Ctrl-C would (the process that follows it interrupts the runner,
then kills it after the grace period); a run whose follower is gone has its pod deleted."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .text import terminal_text

WAIT_SECONDS = 30.0


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``cancel`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("cancel", help=summary, description=__doc__)
    parser.add_argument("run_id", metavar="RUN", help="a run id from `gpu-offload runs` (or its unique start)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ask, then wait up to :data:`WAIT_SECONDS` for the run to end; 1 when there is no such run."""
    from ..engine.runs.listing import cancel_elsewhere
    from ..liqo_peering.errors import GpuOffloadError
    from .listing import find, listing, where

    try:
        place = where()
        record = find(listing(place).runs, args.run_id)
        if record is None:
            print(f"gpu-offload cancel: no run {args.run_id} (or more than one starts so); `gpu-offload runs` "
                  "lists them", file=sys.stderr)
            return 1
        print(cancel_elsewhere(record, place.book, place.runs))
        deadline = time.monotonic() + WAIT_SECONDS
        while not record.finished and record.pid and time.monotonic() < deadline:
            time.sleep(0.2)
            record = find(listing(place).runs, record.run_id) or record
    except GpuOffloadError as exc:
        print(f"gpu-offload cancel: {exc}", file=sys.stderr)
        return 1
    if record.finished:
        print(terminal_text(f"run {record.run_id} ended: {record.state}{' (' + record.detail + ')' if record.detail else ''}"))
    return 0
