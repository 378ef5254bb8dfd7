"""``gpu-offload run --noblock``: the run outlives the command in a detached follower.

The command starts itself again without ``--noblock``, in a new session (a Ctrl-C or a closed terminal
does not reach it), with its output going to a log file in the state directory. That follower is the same
blocking ``run`` (one code path): it records the run where ``gpu-offload runs`` reads it, follows the
runner (on a cluster, its pod stays until the script ends, and is deleted then), and obeys ``gpu-offload
cancel`` through the record's cancel request, as a kernel does for the panel's button.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time

from .text import terminal_text

STARTED_WITHIN = 120.0
"""Seconds the command waits for the follower to record its run (packing and placing come first)."""


def child_argv(args: argparse.Namespace, log: str) -> list[str]:
    """The follower's command line: this run's options without ``--noblock``, with its log file."""
    from ..engine.options import carried_argv

    argv = [sys.executable, "-m", "gpu_offload.cli", "run", *carried_argv(args), "--detached-log", log]
    return [*argv, str(args.script), *args.script_args]  # the follower starts in this directory


def start_detached(args: argparse.Namespace) -> int:
    """Start the follower; print the run id once it is recorded, or the follower's error if it ends first."""
    from ..engine.runs.records import RunBook

    book = RunBook()
    book.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = book.root / f"cli-{secrets.token_hex(6)}.log"
    with open(log, "wb") as out:
        child = subprocess.Popen(child_argv(args, str(log)), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd())
    deadline = time.monotonic() + STARTED_WITHIN
    while time.monotonic() < deadline:
        records, _ = book.read_all()
        mine = [r for r in records if r.pid == child.pid]
        if mine:
            run_id = mine[0].run_id
            print(f"run {run_id} started in the background ({mine[0].backend}); output: gpu-offload logs "
                  f"{run_id} -f; stop it: gpu-offload cancel {run_id}")
            return 0
        if child.poll() is not None:
            sys.stderr.write(terminal_text(log.read_text(errors="replace")))
            log.unlink(missing_ok=True)
            return child.returncode or 1
        time.sleep(0.1)
    print(f"gpu-offload run: the background run has not started within {STARTED_WITHIN:g} s; its output so far "
          f"is in {log}; `gpu-offload runs` lists it once it starts", file=sys.stderr)
    return 1
