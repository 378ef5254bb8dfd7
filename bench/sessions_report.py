"""The figures and notes of bench_sessions_replay.py, from each tree's tally (one Run, trees side by side)."""

from __future__ import annotations

import argparse
from typing import Any

from harness import Run, percentile

HOUR = 3600.0


def record(run: Run, results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    first = next(iter(results.values()))
    span = f"the first {args.days:g} of the trace's busy days" if args.days is not None else (
        f"the trace's {first['days']:.0f} busy days")
    run.note(f"replay: {span}, {first['trace_pods']} trace pods, {first['sessions']} sessions "
             f"({first['light']} light users'), {first['shots']} one-shot cells, a pool of {first['gpus']} GPUs "
             f"({args.share:.0%} of the trace's peak demand); users: bench/session_users.py")
    for tree, result in results.items():
        name = f"pool {result['gpus']} GPUs, {tree}"
        t, ledger = result["tally"], result["ledger"]
        if result["absent"]:
            run.note(f"{name}: not in its code: {'; '.join(result['absent'])}")
        run.figure(f"{name}: GPU-hours returned to the pool by idle release", t["returned"] / HOUR, "GPU-h",
                   lower_is_better=False)
        waits, for_gpu = t["light_waits"], t["light_gpu_waits"]
        acquired = [w for w in waits if w > 0]
        run.figure(f"{name}: light users' wait to a cell's start", waits or [0.0], "s")
        run.figure(f"{name}: light users' wait to a cell's start, cells that waited", acquired or [0.0], "s")
        run.figure(f"{name}: light users' wait for a GPU, cells that needed a pod", for_gpu or [0.0], "s")
        run.figure(f"{name}: heavy users' wait to a cell's start, cells that waited",
                   [w for w in t["heavy_waits"] if w > 0] or [0.0], "s")
        for cause in ("preemption", "idle release"):
            run.figure(f"{name}: finished cells' work resumed after {cause}", t["resumed"][cause] / HOUR, "GPU-h",
                       lower_is_better=False)
            run.figure(f"{name}: finished cells' work lost after {cause}", t["lost"][cause] / HOUR, "GPU-h")
        run.figure(f"{name}: cells' work cut off by preemption", t["partial_lost"] / HOUR, "GPU-h")
        run.figure(f"{name}: trace pods' work lost to preemption", t["trace_lost"] / HOUR, "GPU-h")
        run.figure(f"{name}: sessions given up", t["gave_up"], "sessions")
        errors = t["errors"]
        if errors:
            run.figure(f"{name}: start estimate abs error / actual wait, at arrival", errors, "ratio")
            run.goal(f"{name}: start estimate's median abs error / actual wait", percentile(errors, 0.5), 0.30, "x")
        run.note(f"{name}: light users' wait to a cell's start median {percentile(waits, 0.5):.0f} s, p90 "
                 f"{percentile(waits, 0.9):.0f} s ({len(acquired)} of {len(waits)} cells waited: median "
                 f"{percentile(acquired, 0.5):.0f} s, p90 {percentile(acquired, 0.9):.0f} s; for a GPU, "
                 f"{len(for_gpu)} cells: median {percentile(for_gpu, 0.5):.0f} s, p90 "
                 f"{percentile(for_gpu, 0.9):.0f} s); {t['releases']} idle "
                 f"releases returned {t['returned'] / HOUR:.1f} GPU-h; {t['sessions_preempted']} session pods "
                 f"preempted, {t['gave_up']} sessions given up (a cell cut off 3 times in a row); finished work resumed {sum(t['resumed'].values()) / HOUR:.1f} GPU-h, lost "
                 f"{sum(t['lost'].values()) / HOUR:.1f} GPU-h (run again: {ledger['redone'] / HOUR:.1f} GPU-h), cut off "
                 f"mid-cell {t['partial_lost'] / HOUR:.1f} GPU-h; one-shot cells: {t['shots_done']} done, "
                 f"{t['shots_rerun']} rerun after preemption, {t['shots_failed']} failed by it; trace pods preempted "
                 f"{t['trace_preempted']} times ({t['trace_lost'] / HOUR:.1f} GPU-h lost); "
                 f"sessions held {ledger['held'] / HOUR:.1f} GPU-h, {ledger['idle'] / HOUR:.1f} of them idle")
        if t["waited"]:
            median = f"median {percentile(errors, 0.5):.2f}" if errors else "none"
            run.note(f"{name}: start estimate at arrival for the {t['waited']} users' pods that waited: "
                     f"{t['without']} without an estimate; abs error / actual wait {median}")
