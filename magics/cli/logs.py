"""``gpu-offload logs RUN [-f]``: a run's output; ``-f`` follows it until the run ends.

A script's run keeps its whole output in its log file (``--noblock``) in the state directory; a cell's run
keeps the end of its output in its record (what the panel shows).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

POLL = 0.2
LAST_WORDS_SECONDS = 30.0
"""How long ``-f`` waits, once the run is recorded as ended, for its follower to write its last lines and exit."""


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``logs`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("logs", help=summary, description=__doc__)
    parser.add_argument("run_id", metavar="RUN", help="a run id from `gpu-offload runs` (or its unique start)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the log (and follow it); 1 when there is no such run or its output is gone."""
    from ...liqo_peering.errors import GpuOffloadError
    from .listing import find, listing, where

    try:
        place = where()
        record = find(listing(place).runs, args.run_id)
    except GpuOffloadError as exc:
        print(f"gpu-offload logs: {exc}", file=sys.stderr)
        return 1
    if record is None:
        print(f"gpu-offload logs: no run {args.run_id} (or more than one starts so); `gpu-offload runs` lists "
              "them", file=sys.stderr)
        return 1
    if record.log and Path(record.log).is_file():
        return _print_file(Path(record.log), record.run_id, args.follow, place)
    if record.pid == 0:  # known only from its pod: whoever followed it is gone, and so is its output
        print(f"gpu-offload logs: run {record.run_id} has a pod but no follower left: its output was not kept "
              f"here. Stop it with `gpu-offload cancel {record.run_id}`.", file=sys.stderr)
        return 1
    if record.script is not None:
        print(f"gpu-offload logs: run {record.run_id} was followed in a terminal, which showed its output; only "
              "its end is kept:", file=sys.stderr)
    sys.stdout.write(record.tail)
    return 0


def _print_file(path: Path, run_id: str, follow: bool, place: Any) -> int:
    from ..dashboard.records import pid_alive
    from .listing import find, listing

    with open(path, "rb") as log:
        while True:
            chunk = log.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            if not follow:
                return 0
            record = find(listing(place).runs, run_id)
            if record is None or record.finished:
                # the follower records the end, then says how the run ended (e.g. interrupted) and exits: the
                # log is complete only once that process is gone
                deadline = time.monotonic() + LAST_WORDS_SECONDS
                while record is not None and record.pid and pid_alive(record.pid) and time.monotonic() < deadline:
                    time.sleep(POLL)
                rest = log.read()
                sys.stdout.buffer.write(rest)
                sys.stdout.flush()
                return 0
            time.sleep(POLL)
