"""``gpu-offload runs``: my runs (notebook cells and scripts, every kernel) with state, cluster, GPUs and age."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..engine.runs.records import RunEntry
from .text import terminal_text


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``runs`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("runs", help=summary, description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    parser.set_defaults(func=run)


def age(seconds: float) -> str:
    """``42s``, ``7m``, ``3h``, ``2d``: as kubectl prints an age."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def as_json(record: RunEntry, now: float) -> dict[str, Any]:
    """The fields a script reads about a run (times in RFC 3339, UTC)."""
    from ..liqo_peering.timestamps import rfc3339
    from .listing import kind

    return {"run_id": record.run_id, "kind": kind(record), "state": record.state, "detail": record.detail,
            "backend": record.backend, "cluster": record.cluster, "gpus": record.gpus, "kernel": record.kernel,
            "script": record.script, "started": rfc3339(record.started), "ended": rfc3339(record.ended),
            "age_seconds": round(now - record.started, 3)}


def table(records: tuple[RunEntry, ...], now: float) -> str:
    """Aligned columns, newest first."""
    from .listing import kind

    rows = [("RUN", "KIND", "STATE", "CLUSTER", "GPUS", "AGE", "WHAT")]
    for r in records:
        what = r.script if r.script else f"kernel {r.kernel}"
        rows.append((r.run_id, kind(r), r.state, r.cluster, str(r.gpus), age(now - r.started), what))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # the last column (a command line) is not padded
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=False)) + "  " + row[-1]
                     for row in rows)


def run(args: argparse.Namespace) -> int:
    """Print the runs; problems (an unreachable cluster) go to stderr and do not hide the rest."""
    from ..liqo_peering.errors import GpuOffloadError
    from .listing import listing, where

    try:
        found = listing(where())
    except GpuOffloadError as exc:
        print(f"gpu-offload runs: {exc}", file=sys.stderr)
        return 1
    now = time.time()
    for problem in found.problems:
        print(f"gpu-offload runs: warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps([as_json(r, now) for r in found.runs], indent=1))
    elif found.runs:
        print(terminal_text(table(found.runs, now)))  # a run's detail may be a donor's words
    else:
        print("no runs yet: start one with `gpu-offload run SCRIPT.py` or %%gpu_offload in a notebook")
    return 0
