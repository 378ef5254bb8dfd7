"""``gpu-offload logs RUN [-f]``: a run's output; ``-f`` follows it until the run ends.

A script's run keeps its whole output in its log file (``--noblock``) in the state directory, written by
the process that follows it; a cell's run keeps the end of its output in its record (what the panel
shows). On a cluster with object storage (``GPU_OFFLOAD_S3_BUCKET``) a script's runner also uploads its
log when it ends, so the log survives its pod and its follower and can be read from any machine with the
user's storage credentials; without storage, a run whose follower is gone loses its output with its pod.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time
from pathlib import Path
from typing import Any

from .text import terminal_text

POLL = 0.2
FOLLOWER_EXIT = 30.0
"""Seconds ``-f`` waits, once the run is recorded as ended, for its follower to finish writing and exit."""
STORED_POLL = 1.0
"""Seconds between looks for a stored log while ``-f`` waits for a follower-less run's pod to end."""
NO_STORAGE = ("without object storage (GPU_OFFLOAD_S3_BUCKET) a background run's log is kept only by the "
              "`gpu-offload` process that followed it, and what it did not see is gone with the pod. Set "
              "GPU_OFFLOAD_S3_BUCKET (and GPU_OFFLOAD_S3_ENDPOINT) for the next runs to keep their logs")


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``logs`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("logs", help=summary, description=__doc__)
    parser.add_argument("run_id", metavar="RUN", help="a run id from `gpu-offload runs` (or its unique start)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the log (and follow it); 1 when there is no such run or its output is gone."""
    from ..engine.errors import OffloadError
    from ..liqo_peering.errors import GpuOffloadError

    try:
        return _logs(args.run_id, args.follow)
    except (GpuOffloadError, OffloadError) as exc:
        print(f"gpu-offload logs: {exc}", file=sys.stderr)
        return 1


def _logs(wanted: str, follow: bool) -> int:
    from .listing import find, listing, where

    place = where()
    record = find(listing(place).runs, wanted)
    if record is None:
        stored = place.storage.read_log(wanted) if place.storage is not None else None
        if stored is not None:  # its pod and its record are elsewhere or gone; its runner kept the log
            return _print_stored(stored)
        why = ("no log of that id is stored either" if place.storage is not None
               else NO_STORAGE[0].lower() + NO_STORAGE[1:])
        print(f"gpu-offload logs: no run {wanted} (or more than one starts so); `gpu-offload runs` lists them. "
              f"If it ran on a cluster, {why}", file=sys.stderr)
        return 1
    follower_gone = record.pid == 0 or (record.finished and record.ended is None)
    local = Path(record.log) if record.log and Path(record.log).is_file() else None
    if local is not None and not follower_gone:
        return _print_file(local, record.run_id, follow, place)
    if record.backend == "kubernetes" and record.script is not None and follower_gone:
        return _follower_gone(place, record, local, follow)
    if record.pid == 0:  # a cell's pod whose kernel is not on this machine: its output went to that kernel
        print(f"gpu-offload logs: run {record.run_id} has a pod but no kernel here: its output was not kept "
              f"here. Stop it with `gpu-offload cancel {record.run_id}`.", file=sys.stderr)
        return 1
    if record.script is not None:
        print(f"gpu-offload logs: run {record.run_id} was followed in a terminal, which showed its output; only "
              "its end is kept:", file=sys.stderr)
    sys.stdout.write(terminal_text(record.tail))
    return 0


def _follower_gone(place: Any, record: Any, local: Path | None, follow: bool) -> int:
    """A background script whose follower died (or was on another machine): its stored log, once its pod
    has ended and uploaded it; else what the follower wrote, and why the rest is not here."""
    run_id = record.run_id
    storage = place.storage
    stored = storage.read_log(run_id) if storage is not None else None
    while stored is None and follow and storage is not None:
        left = _pod_left(place, run_id)
        stored = storage.read_log(run_id)  # after the look at the pod: a runner uploads before its pod ends
        if not left:
            break
        time.sleep(STORED_POLL)
    if stored is not None:
        return _print_stored(stored)
    if local is not None:
        sys.stdout.buffer.write(local.read_bytes())
        sys.stdout.flush()
    seen = "what it had written is above; " if local is not None else ""
    if storage is None:
        print(f"gpu-offload logs: the process that followed run {run_id} is gone: {seen}{NO_STORAGE}.",
              file=sys.stderr)
    elif _pod_left(place, run_id):
        print(f"gpu-offload logs: the process that followed run {run_id} is gone and its pod still runs: "
              f"{seen}its whole log is kept in object storage when it ends (`gpu-offload logs {run_id} -f` waits "
              f"for that; `gpu-offload cancel {run_id}` ends it now).", file=sys.stderr)
    else:
        print(f"gpu-offload logs: run {run_id} ended without a stored log (its pod was killed before its runner "
              f"could upload it, or it ran before object storage was configured): {seen}the rest is gone.",
              file=sys.stderr)
    return 0 if local is not None else 1  # 0: part of the output was there to print


def _pod_left(place: Any, run_id: str) -> bool:
    """Whether a pod of the run still exists and has not ended."""
    if place.runs is None:
        return False
    return any(r.run_id == run_id and r.state not in ("done", "failed") for r in place.runs.user_runs())


def _print_stored(data: bytes) -> int:
    # written by the donor's pod: shown as text, never as terminal control sequences
    sys.stdout.write(terminal_text(data.decode("utf-8", "replace")))
    sys.stdout.flush()
    return 0


def _print_file(path: Path, run_id: str, follow: bool, place: Any) -> int:
    from .listing import find, listing

    text = codecs.getincrementaldecoder("utf-8")("replace")  # a chunk may end inside a character
    with open(path, "rb") as log:
        while True:
            chunk = log.read()
            if chunk:
                sys.stdout.write(terminal_text(text.decode(chunk)))
                sys.stdout.flush()
            if not follow:
                return 0
            record = find(listing(place).runs, run_id)
            if record is None or record.finished:
                # the follower records the end, then writes why the run ended (a traceback, "interrupted")
                # and exits: the rest of the file is complete once it has exited
                _wait_exit(record.pid if record is not None else 0)
                rest = log.read()
                sys.stdout.write(terminal_text(text.decode(rest, final=True)))
                sys.stdout.flush()
                return 0
            time.sleep(POLL)


def _wait_exit(pid: int) -> None:
    from ..engine.runs.records import pid_alive

    deadline = time.monotonic() + FOLLOWER_EXIT
    while pid and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL)
