"""The cluster page's charts with the most samples the database keeps: 100 donors, 8 days (the retention).

A SQLite database (the chart's default, on tmpfs) seeded with a sample of every donor every 2 minutes for 8
days (a busy donor: the periodic sample every 5 minutes plus changes); then, as the handler does it without
the HTTP round trip, one donor's page: its day and week charts read from the samples and rendered with the
rest of the page; and one periodic round of samples written (100 donors, with the retention's delete). Goal: the
cluster page within the pages' 150 ms.

    .venv/bin/python bench/bench_donor_charts.py
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_offload.hub_extension.accounting.store import GpuSample, Store  # noqa: E402
from gpu_offload.hub_extension.service import pages, views  # noqa: E402
from gpu_offload.hub_extension.service.sampling import RETENTION, Sampler  # noqa: E402
from gpu_offload.hub_extension.service.state import donor_charts  # noqa: E402
from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord  # noqa: E402
from harness import Run, Stopwatch, percentile, timed  # bench/harness.py: the script's folder is on sys.path

DONORS, EVERY = 100, timedelta(minutes=2)
GOAL_MS = 150.0


def inventory(round_: int) -> Inventory:
    return Inventory(tuple(ClusterRecord(f"donor-{d:03d}", f"donor-{d:03d}", "provider", "healthy", virtual_nodes=(
        VirtualNodeRecord(f"donor-{d:03d}-gpu", f"donor-{d:03d}", 8, 8, (d + round_) % 9),)) for d in range(DONORS)))


def main() -> int:
    now = datetime.now(timezone.utc)
    ctx = pages.HubContext("/services/gpu-offload/", "admin", True, "xsrf")
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        store = Store(f"sqlite:///{tmp}/usage.sqlite")
        started = Stopwatch()
        rounds = int(RETENTION / EVERY)
        for r in range(rounds):
            at = now - RETENTION + EVERY * r
            store.add_samples([GpuSample(at, f"donor-{d:03d}", 8, 8 - (d + r) % 9 if (d + r) % 9 <= 8 else 0,
                                         (d + r) % 9) for d in range(DONORS)], now - RETENTION - EVERY)
        seeded_s = started.seconds
        inv = inventory(0)
        detail = views.cluster_detail(inv, "donor-042", [], [], [], now)
        assert detail is not None

        def page() -> str:
            return pages.cluster_page(ctx, detail, donor_charts(store, "donor-042", now))

        sampler, turn = Sampler(store), [0]

        def sample_round() -> None:  # every donor changed, and the period passed: the most one wake-up writes
            turn[0] += 1
            sampler.sample(inventory(turn[0]), now + timedelta(minutes=5 * turn[0]))

        rows = [("cluster page (day and week charts from the samples)", page, 20),
                ("one round of samples, 100 donors, with the retention delete", sample_round, 20)]
        run = Run("donor_charts", "A donor's GPUs over time: the cluster page with 8 days of samples")
        run.note(f"database: SQLite, {rounds * DONORS} samples ({DONORS} donors every {EVERY.seconds // 60} min for "
                 f"{RETENTION.days} days, seeded in {seeded_s:.0f} s); cluster page {len(page()) / 1024:.0f} KiB; "
                 f"goal: cluster page <= {GOAL_MS:g} ms")
        page_p95 = 0.0
        for name, fn, repeat in rows:
            wall, cpu = timed(fn, repeat)
            run.figure(f"{name} wall", wall, "ms")
            run.figure(f"{name} CPU", cpu, "ms")
            if name.startswith("cluster page"):
                page_p95 = percentile(wall, 0.95)
        run.goal("cluster page wall p95", page_p95, GOAL_MS)
        run.write()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
