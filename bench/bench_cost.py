"""What cost and the charts add to the service's pages, with a month of runs in its database.

A SQLite database (the chart's default) seeded with 30 days of finished runs (200 users, 10 donors, 20,000
runs, priced); then, as the handlers do it without the HTTP round trip: the users page (charts, the
month's cost per user and donor, all months, all-time totals) rendered, ``api/admin/cost``, ``api/me``'s
spend, the month's CSV, and one run recorded with its pricing. The service keeps the users page's records
until a run is recorded (``HubState.usage_page``): the first view after a run reads the database, the next
ones only render. Goal: the users page within the pages' 150 ms.

    .venv/bin/python bench/bench_cost.py
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_offload.hub_extension import billing, pages, views  # noqa: E402
from gpu_offload.hub_extension.cost import month_of, priced  # noqa: E402
from gpu_offload.hub_extension.state import usage_charts  # noqa: E402
from gpu_offload.hub_extension.store import Store  # noqa: E402
from gpu_offload.hub_extension.usage import MeteredRun  # noqa: E402
from machine import machine_line  # noqa: E402

RUNS, USERS, DONORS, DAYS = 20_000, 200, 10, 30
GOAL_MS = 150.0


def seed(store: Store, now: datetime) -> None:
    rng = random.Random(17)
    start = now - timedelta(days=DAYS)
    store.note_prices({(f"donor-{d}", f"donor-{d}-gpu"): 2.0 + d / 4 for d in range(DONORS)}, start)
    for i in range(RUNS):
        ended = start + timedelta(seconds=rng.uniform(0, DAYS * 86400))
        donor = rng.randrange(DONORS)
        run = MeteredRun(f"uid-{i}", "jhub", f"gpuo-{i}", f"user{rng.randrange(USERS):03d}", f"donor-{donor}",
                         f"donor-{donor}-gpu", rng.choice((1, 1, 2, 4)), ended - timedelta(minutes=rng.uniform(1, 240)),
                         ended, "Succeeded")
        store.record_run(priced(run, store.price_book(run.cluster_id, run.node)))


def timed(fn: Callable[[], object], repeat: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        cpu.append((time.process_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start) * 1000)
    return wall, cpu


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def main() -> int:
    now = datetime.now(timezone.utc)
    month = month_of(now)
    ctx = pages.HubContext("/services/gpu-offload/", "admin", True, "xsrf")
    # in memory (tmpfs) where there is one: seeding commits 20,000 times, and disk syncs are not what is measured
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        store = Store(f"sqlite:///{tmp}/usage.sqlite")
        started = time.perf_counter()
        seed(store, now)
        seeded_s = time.perf_counter() - started

        def report() -> views.CostReport:
            return views.CostReport(month, tuple(store.costs("user", month)), tuple(store.costs("donor", month)),
                                    tuple(store.costs("month")))

        def records() -> tuple[object, ...]:
            return store.totals(), report(), usage_charts(store, month, now.date())

        def users_page() -> str:  # the first view after a run was recorded: what HubState.usage_page reads
            return pages.users_page(ctx, store.totals(), report(), usage_charts(store, month, now.date()))

        kept = records()

        def users_page_kept() -> str:  # any later view until the next run: the kept records, rendered
            return pages.users_page(ctx, *kept)  # type: ignore[arg-type]

        def csv_month() -> int:
            return sum(len(chunk) for chunk in billing.csv_chunks(store.export(month)))

        extra = [0]

        def record_one() -> None:
            extra[0] += 1
            run = MeteredRun(f"new-{extra[0]}", "jhub", "gpuo-new", "user000", "donor-1", "donor-1-gpu", 1,
                             now - timedelta(hours=1), now, "Succeeded")
            store.record_run(priced(run, store.price_book("donor-1", "donor-1-gpu")))

        size = len(users_page())
        rows = [("users page after a run was recorded (reads the month)", users_page, 20),
                ("users page, records kept", users_page_kept, 20),
                ("api/admin/cost of the month", report, 20),
                ("api/me spend of one user", lambda: store.spend("user001", month), 50),
                ("CSV of the month", csv_month, 5),
                ("record one run with its pricing", record_one, 50)]
        print(machine_line())
        print(f"date: {now:%Y-%m-%d %H:%M} UTC")
        print(f"database: SQLite, {RUNS} runs over {DAYS} days, {USERS} users, {DONORS} donors (seeded in "
              f"{seeded_s:.0f} s); users page {size / 1024:.0f} KiB; goal: users page <= {GOAL_MS:g} ms\n")
        print("| operation | runs | wall median ms | wall p95 ms | CPU median ms | CPU p95 ms |")
        print("|---|---:|---:|---:|---:|---:|")
        worst = 0.0
        for name, fn, repeat in rows:
            wall, cpu = timed(fn, repeat)
            print(f"| {name} | {repeat} | {statistics.median(wall):.2f} | {p95(wall):.2f} | "
                  f"{statistics.median(cpu):.2f} | {p95(cpu):.2f} |")
            if name.startswith("users page"):
                worst = max(worst, p95(wall))
        verdict = "meets" if worst <= GOAL_MS else "misses"
        print(f"worst users page wall p95 {worst:.2f} ms: {verdict} the {GOAL_MS:g} ms goal")
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
