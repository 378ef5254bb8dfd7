"""How close a queued cell's start estimate can get, on the sessions trace replay (issue 27, item 5): the information
limit, the best an estimator of the product's information reaches, and the kernel's estimate, side by side.

The replay is bench_sessions_replay.py's (the Alibaba trace's pods with notebook users mixed in, Kueue's
BestEffortFIFO with preemption, the product's own decisions), on pools of 90, 70 and 50 % of the trace's peak
demand. Every pod that cannot start when it is created is a wait, estimated at that moment (what a waiting cell
shows first) and again at a moment drawn uniformly in the wait (what a user glancing at the cell then sees, the
wait still ahead as the actual; bench/wait_bound.py records them):

- **oracle**: knows every running pod's true departure and how long each pod ahead will hold its GPUs, and replays
  the line forward; it does not know the pods that arrive later. Its error is what knowing every end leaves: the
  later arrivals (a higher-priority one jumping the line, a smaller pod passing). It is not a bound for every
  estimator: it always assumes no one arrives, where a fitted value can allow for the usual arrivals on average.
- **best value per class of queue state**: the waits grouped by what the product knows when a run starts waiting
  (its place in line, class, GPUs, and the kernel's pace estimate, a factor-of-two bucket), each class given the
  one value within 30 % of the most of its waits. Fitted on every wait it is a bound (no estimator seeing only
  these does better here, since it sees the answers); fitted on the even waits and scored on the odd ones (and
  back), what fitting reaches when the fit has seen the same days (optimistic: the halves interleave in time);
  **learned online** (each wait estimated from the last 200 waits of its class that had already started, as a hub
  watching the queue could), what an estimator of this kind reaches when it has only the past.
- **kernel**: ``wait_estimate.estimate`` of this tree (the line's recent pace), and how often its range held the
  start.
- **known ends**: the ends the product sets itself (an idle session's release, a protected session's protection end,
  bench/wait_bound.py's ``known_start``), as an estimate where they free enough GPUs, with the error split by waits
  with and without such an end.

The goal: a median absolute error at most 30 % of the actual wait (that is, at least half the waits within 30 %).
An estimate that is absent counts as a miss. Run: ``.venv/bin/python bench/bench_wait_bound.py`` (about 1-3
minutes, most of it the 50 % pool's oracle; ``--quick``: 3 days, the 90 % pool).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import Run, machine_line
from wait_bound import (
    TOLERANCE,
    Online,
    Wait,
    Watched,
    bucket,
    class_bound,
    median,
    online,
    place,
    relative,
)

CLASSES: dict[str, Callable[[Wait], object]] = {
    "place and class": lambda w: (place(w.position), w.priority),
    "place, class, GPUs and pace": lambda w: (place(w.position), w.priority, w.gpus, bucket(w.rate[0])),
}


def replay(share: float, days: float | None) -> tuple[int, list[Wait], list[Wait]]:
    """The replay twice (the first for the departures the oracle knows); the waits that ended in a start, seen at
    their start and at a moment in them."""
    from alibaba_trace import peak_gpus
    from bench_sessions_replay import fill, load
    from session_rules import Rules

    tasks, begin, end = load(days)
    gpus = round(peak_gpus(tasks) * share)
    first: Watched | None = None
    for _ in range(2):
        pool = Watched(gpus, Rules(), first)
        fill(pool, tasks, begin, end)
        pool.run()
        first = pool
    assert first is not None
    return gpus, *([w for w in seen.values() if w.actual > 0] for seen in (first.waits, first.moments))


def _line(label: str, errors: Sequence[float]) -> str:
    share = sum(e <= TOLERANCE for e in errors) / max(1, len(errors))
    return f"{label} {median(errors):.2f} / {share:.0%}"


def _record(run: Run, tag: str, waits: list[Wait], models: list[Online]) -> None:
    """One population's figures: each estimator's median error over the actual wait and share within 30 %."""
    if not waits:
        run.note(f"{tag}: no waits")
        return
    rows: list[tuple[str, str, list[float]]] = [
        ("oracle", "oracle (every running pod's end known)", [relative(w.oracle, w.actual) for w in waits])]
    for (name, key), short in zip(CLASSES.items(), ("place", "pace"), strict=True):
        fitted, held, count = class_bound(waits, key)
        rows += [(f"best per class ({short}), bound", f"best value per class of {name} ({count} classes), fitted "
                  "on every wait: bound", fitted),
                 (f"best per class ({short}), held out", f"the same ({short}) fitted on the even waits, scored on the odd "
                  "ones and back", held)]
    rows.append(("online per class", "learned online from the class's past waits (place, class, GPUs, pace)",
                 [relative(m.guess, m.wait.actual) for m in models]))
    rows.append(("kernel", "kernel (this tree's wait_estimate)", [relative(w.rate[0], w.actual) for w in waits]))
    run.note(f"{tag}, {len(waits)} waits: median error / share within 30 %: "
             + "; ".join(_line(label, errors) for _, label, errors in rows))
    for short, label, errors in rows:
        missing = sum(e == float("inf") for e in errors)
        run.figure(f"{tag}: {short}: median error", median(errors), "ratio")
        run.figure(f"{tag}: {short}: within 30 %", sum(e <= TOLERANCE for e in errors) / len(errors),
                   "share", lower_is_better=False)
        if missing:
            run.note(f"{tag}: {label}: {missing} waits without an estimate (counted as misses)")
    run.goal(f"{tag}: kernel's median error over the actual wait", median(rows[-1][2]), 0.30, "x")
    ranges = [(w.rate[1], w.rate[2], w.actual) for w in waits if w.rate[1] is not None and w.rate[2] is not None]
    learned = [(m.low, m.high, m.wait.actual) for m in models if m.own and m.low is not None and m.high is not None]
    for label, spans in (("kernel's range", ranges), ("online model's 10th-90th percentile range", learned)):
        if spans:
            held = sum(low <= actual <= high for low, high, actual in spans) / len(spans)
            wide = median([high / max(low, 1.0) for low, high, _ in spans])
            run.figure(f"{tag}: {label}: starts inside", held, "share", lower_is_better=False)
            run.note(f"{tag}: {label} held the start in {held:.0%} of {len(spans)} estimates (meant: 80 %); its "
                     f"median high / low {wide:.1f}")


PLACES = ("head", "2-4", "5-16", "17+")


def _by_place(run: Run, tag: str, waits: list[Wait], models: list[Online]) -> None:
    """The oracle's, the online model's and the kernel's error by place in line: the place is what a kernel knows
    in advance, so a place where the goal is met would be a case to promise it for."""
    learned = {m.wait.pod: m.guess for m in models}
    parts = []
    for name in PLACES:
        chosen = [w for w in waits if place(w.position) == name]
        if chosen:
            parts.append(f"{name} ({len(chosen)}): " + ", ".join(
                _line(label, [relative(guess(w), w.actual) for w in chosen]) for label, guess in (
                    ("oracle", lambda w: w.oracle), ("online", lambda w: learned[w.pod]),
                    ("kernel", lambda w: w.rate[0]))))
    run.note(f"{tag}: by place in line, median error / share within 30 %: " + "; ".join(parts))


def _known(run: Run, tag: str, waits: list[Wait]) -> None:
    """The waits where the product knows an end that frees enough GPUs, and those where it does not."""
    known = [w for w in waits if w.known is not None]
    unknown = [w for w in waits if w.known is None]
    parts = [f"{len(known)} of {len(waits)} waits with a known end"]
    if known:
        before = sum(w.actual <= w.known * (1 + TOLERANCE) for w in known if w.known is not None) / len(known)
        parts += [_line("the known end as the estimate", [relative(w.known, w.actual) for w in known]),
                  _line("the earlier of it and the kernel's",
                        [relative(min(x for x in (w.known, w.rate[0]) if x is not None), w.actual) for w in known]),
                  _line("kernel", [relative(w.rate[0], w.actual) for w in known]),
                  _line("oracle", [relative(w.oracle, w.actual) for w in known]),
                  f"started by the known end (+30 %) in {before:.0%}"]
        run.figure(f"{tag}: known end as the estimate, waits with one: median error",
                   median([relative(w.known, w.actual) for w in known]), "ratio")
    if unknown:
        parts += [f"without: {_line('kernel', [relative(w.rate[0], w.actual) for w in unknown])}, "
                  f"{_line('oracle', [relative(w.oracle, w.actual) for w in unknown])}"]
    run.note(f"{tag}: known ends (median error / share within 30 %): " + "; ".join(parts))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the trace's first 3 busy days, the 90 %% pool")
    parser.add_argument("--shares", default="", help="pools as shares of the trace's peak demand (default 0.9,0.7,0.5)")
    parser.add_argument("--results", help=argparse.SUPPRESS)  # a folder for the result (a test's own)
    args = parser.parse_args(argv)
    from bench_sessions_replay import pool_shares
    from harness import RESULTS

    shares = pool_shares(args.shares, args.quick)
    if shares is None:
        return 1
    run = Run("wait_bound_quick" if args.quick else "wait_bound",
              "How close a start estimate can get: oracle, best of the product's information, the kernel's estimate "
              "(sessions trace replay)" + (" (--quick: 3 days)" if args.quick else ""),
              script="bench/bench_wait_bound.py")
    run.note(f"run {run.started} at {run.revision}; {machine_line(run.machine)}")
    run.note("each wait estimated when it starts waiting and at a moment drawn in it; median error = median of |estimate - actual| / actual "
             "(a missing estimate is a miss); goal: at most 0.30, that is at least 50 % of waits within 30 %")
    for share in shares:
        gpus, *views = replay(share, 3.0 if args.quick else None)
        for when, waits in zip(("at arrival", "at a random moment"), views, strict=True):
            learned = online(waits, CLASSES["place, class, GPUs and pace"])
            by_pod = {m.wait.pod: m for m in learned}
            for who, chosen in (("every pod that waited", waits),
                                ("users' pods that waited", [w for w in waits if w.user])):
                tag = f"pool {gpus} GPUs ({share:.0%} of peak), {who}, {when}"
                _record(run, tag, chosen, [by_pod[w.pod] for w in chosen])
                _by_place(run, tag, chosen, [by_pod[w.pod] for w in chosen])
                _known(run, tag, chosen)
    run.write(Path(args.results) if args.results else RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
