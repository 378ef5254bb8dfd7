"""Work that survives sharing, on a trace replay (issue 27): the Alibaba trace's pods as the load, notebook users'
sessions and one-shot cells mixed in, replayed once with this tree's decisions and once with a pinned earlier
revision's (a temporary git worktree), side by side in one run.

The load: the trace's GPU pods (``default`` workload, ../shared/traces/) at their creation time, holding their GPUs
for their traced lifetime, on a pool of a share of their peak concurrent demand. The users: session_users.py (a
seeded, documented model: light users exploring, heavy users training, one-shot cells). The pool:
session_pool.py (Kueue's BestEffortFIFO with preemption of lower priorities), the sessions: session_flow.py.
The decisions are the product's own code of each tree (session_rules.py): the idle timeout, the class a session
pod starts at and its protection, the rerun of a preempted one-shot cell, whether a session's state outlives its
pod, and the start estimate.

Figures per tree: GPU-hours returned to the pool by idle release; light users' waits for a cell (every cell, and
the cells that had to get a pod); the GPU-hours of finished cells' results resumed from a checkpoint or lost
(after a preemption, after an idle release), and cut off mid-cell; one-shot cells rerun or failed; the start
estimate's absolute error over the actual wait, at arrival, for the users' pods that waited.
Invariants checked as it runs (the test in tests/bench runs ``--quick``): no GPU is booked twice, the pool is empty
at the end, every cell ran, and every GPU second a session held is booked once.

Run: ``.venv/bin/python bench/bench_sessions_replay.py`` (the trace's busy ~35 days; ``--quick``: their first 3 days;
``--before REV``: the pinned revision, default the last one before checkpoints and idle release's checkpoint,
``--before ''``: this tree only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PINNED = "a6ba23f"
"""The last revision before sessions were checkpointed (1209a13), preempted one-shot cells rerun (ddc09bb), idle
timeouts asked per session (cee7cbf), sessions protected (fc346ba) and the start estimate (wait_estimate.py)."""
DAY = 86400.0


def load(days: float | None) -> tuple[list[tuple[int, int, int, str]], float, float]:
    """The trace's pods (created, GPUs, hold, QoS) of the replayed span, and the span's start and end."""
    from alibaba_trace import NEVER, read_tasks

    every = sorted((t.created, max(1, t.gpus), t.deleted - t.created, t.qos) for t in read_tasks("default")
                   if t.deleted < NEVER and t.deleted >= t.created)
    begin = _busy_from(every)
    end = begin + days * DAY if days is not None else max(t[0] for t in every)
    return [t for t in every if t[0] < end], begin, end


def fill(pool: Any, tasks: list[tuple[int, int, int, str]], begin: float, end: float) -> tuple[list[Any], list[Any]]:
    """Schedule the trace's pods and the users' sessions and one-shot cells on ``pool``; the sessions and cells."""
    from session_pool import Session, Shot, Trace
    from session_users import users

    for index, (created, gpus, hold, qos) in enumerate(tasks):
        pool.at(created, pool.on_trace_arrive, Trace(index, hold, "interactive" if qos in ("LS", "Guaranteed")
                                                     else "batch"), gpus)
    sessions_users, shots_users = users(begin, end)
    sessions = [Session(u) for u in sessions_users]
    for s in sessions:
        pool.at(s.user.start, pool.on_submit, s)
    shots = [Shot(u) for u in shots_users]
    for shot in shots:
        pool.at(shot.user.start, pool.on_shot, shot)
    return sessions, shots


def replay(days: float | None, share: float, check: bool) -> dict[str, Any]:
    """One replay with the decisions of the tree imported; its tally and the checks' counts."""
    from alibaba_trace import peak_gpus
    from session_flow import Sessions
    from session_rules import Rules

    rules = Rules()
    tasks, begin, end = load(days)
    pool = Sessions(round(peak_gpus(tasks) * share), rules, check)
    sessions, shots = fill(pool, tasks, begin, end)
    pool.run()
    _check(pool, sessions, shots)
    t = pool.tally
    return {"absent": rules.absent, "days": (end - begin) / DAY, "gpus": pool.gpus, "trace_pods": len(tasks), "sessions": len(sessions),
            "light": sum(s.user.light for s in sessions), "shots": len(shots), "tally": t.__dict__,
            "ledger": {k: sum(s.ledger.get(k, 0.0) for s in sessions)
                       for k in ("held", "ran", "restore", "idle", "done", "redone", "partial lost")}}


BUSY = 20
"""The replay's users start on the first day with this many trace pods created (the trace's first ~115 days hold a
few pods a month; its last ~35 days are the busy ones)."""


def _busy_from(tasks: list[tuple[int, int, int, str]]) -> float:
    per_day: dict[int, int] = {}
    for created, *_ in tasks:
        per_day[int(created // DAY)] = per_day.get(int(created // DAY), 0) + 1
    return DAY * min(day for day, n in per_day.items() if n >= BUSY)


def _check(pool: Any, sessions: list[Any], shots: list[Any]) -> None:
    """The replay's invariants: a broken one is a bug of the replay, never a figure."""
    assert not pool.running and not pool.pending and pool.free == pool.gpus, "the pool is not empty at the end"
    for s in sessions:
        assert s.over and (s.done_cells == len(s.user.cells) or s.gave_up), \
            f"session {s.user.index} neither ran every cell nor was given up"
        ledger = s.ledger
        booked = ledger.get("ran", 0.0) + ledger.get("restore", 0.0) + ledger.get("idle", 0.0)
        assert abs(ledger["held"] - booked) < 1e-6 * max(1.0, booked), f"session {s.user.index}: held != booked"
        ran = ledger["done"] + ledger.get("redone", 0.0) + ledger["partial lost"]
        assert abs(ledger.get("ran", 0.0) - ran) < 1e-6 * max(1.0, ran), f"session {s.user.index}: ran != work"
        wanted = s.user.gpus * sum(c.gpu_seconds for c in s.user.cells[:s.done_cells])
        assert abs(ledger["done"] - wanted) < 1e-6 * max(1.0, wanted), f"session {s.user.index}: cells not all done"
    for shot in shots:
        assert shot.done != shot.failed, f"one-shot cell {shot.user.index} neither done nor failed"


def child(tree: str, days: float | None, share: float, check: bool) -> int:
    from bench_warm_cell import import_tree

    import_tree(Path(tree))
    print(json.dumps(replay(days, share, check)))
    return 0


def _run_tree(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, str(BENCH / "bench_sessions_replay.py"), "--child", str(tree), "--share", str(args.share),
            *(["--days", str(args.days)] if args.days is not None else []), *(["--check"] if args.check else [])]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    if done.returncode != 0:
        raise SystemExit(f"the replay of {tree} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def pool_shares(shares: str, quick: bool) -> list[float] | None:
    """The pools a replay of the trace runs, as shares of its peak demand (``--shares``, else 90 % for ``--quick``,
    else three); None, said, when the trace is not on this machine."""
    from alibaba_trace import missing

    problem = missing()
    if problem:
        print(f"skipped: {problem}")
        return None
    return [float(x) for x in shares.split(",")] if shares else [0.9] if quick else [0.9, 0.7, 0.5]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="the trace's first 3 days, every invariant checked")
    parser.add_argument("--days", type=float, help="replay the trace's first DAYS days only")
    parser.add_argument("--shares", default="", help="pools as shares of the trace's peak demand (default "
                        "0.9,0.7,0.5; --quick: 0.9)")
    parser.add_argument("--share", type=float, default=0.9, help=argparse.SUPPRESS)  # the child's one pool
    parser.add_argument("--check", action="store_true", help="check the GPUs held at every admission (slower)")
    parser.add_argument("--before", default=PINNED, help="the pinned revision ('' for none)")
    parser.add_argument("--results", help=argparse.SUPPRESS)  # a folder for the result (the test's own)
    args = parser.parse_args(argv)
    if args.quick:
        args.days, args.check = args.days or 3.0, True
    if args.child:
        return child(args.child, args.days, args.share, args.check)
    from harness import REPO, RESULTS, Run

    shares = pool_shares(args.shares, args.quick)
    if shares is None:
        return 1
    from sessions_report import record

    # --quick is a check, not a figure: its results go apart from the whole replay's
    run = Run("sessions_replay_quick" if args.quick else "sessions_replay",
              "Sessions, idle release, preemption and the start estimate on a trace replay, this tree against a "
              "pinned revision" + (" (--quick: 3 days)" if args.quick else ""), script="bench/bench_sessions_replay.py")
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        trees = {"this tree": REPO}
        if args.before:
            trees[f"pinned {args.before}"] = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(Path(tmp) / "before"),
                            args.before], check=True, capture_output=True)
        try:
            for share in shares:
                args.share = share
                record(run, {name: _run_tree(tree, args) for name, tree in trees.items()}, args)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(tmp) / "before")],
                               capture_output=True)
                shutil.rmtree(Path(tmp) / "before", ignore_errors=True)
    run.write(Path(args.results) if args.results else RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
