"""Running totals of the finished runs, kept as each run is recorded: what the users page, ``api/admin/cost``,
``api/admin/usage`` and the daily charts read.

Summing every run on each view made the users page's first view cost a scan of the month's runs per table
and chart (160 ms of CPU with 20,000 runs, bench/bench_cost.py); the totals here grow with users times
donors times months (and days), not with runs. Two tables, both written in the transaction that records the
run, so they never disagree with it:

- per month (UTC, the month the run ended), user and donor: runs, GPU-seconds, cost of the priced runs,
  unpriced runs, preempted runs. Totals of all time, cost per user / donor / month and a user's spend are
  sums of these rows.
- per day (UTC, the day the run ended) and user, and per day and donor: GPU-seconds (the daily charts).

An older database (or one an older version kept writing) has totals that do not account for every run: the
store rebuilds them from the runs when it opens the database (``missing``, ``rebuild``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import timezone
from typing import Any

import sqlalchemy as sa

from .cost import month_of
from .usage import MeteredRun

metadata = sa.MetaData()
monthly = sa.Table(
    "gpu_offload_usage_monthly",
    metadata,
    sa.Column("month", sa.String(7), primary_key=True),
    sa.Column("user", sa.String(255), primary_key=True),
    sa.Column("cluster_id", sa.String(253), primary_key=True),
    sa.Column("runs", sa.Integer, nullable=False),
    sa.Column("gpu_seconds", sa.Float, nullable=False),
    sa.Column("cost", sa.Float, nullable=False),  # the sum over the priced runs
    sa.Column("unpriced_runs", sa.Integer, nullable=False),
    sa.Column("preempted", sa.Integer, nullable=False),
    sa.Index("gpu_offload_usage_monthly_user", "user"),  # one user's totals (api/me)
)
daily = sa.Table(
    "gpu_offload_usage_daily",
    metadata,
    sa.Column("by", sa.String(8), primary_key=True),  # user or donor: what "key" is
    # YYYY-MM-DD (UTC) as text: sorts as it reads and compares the same in every SQL dialect
    sa.Column("day", sa.String(10), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("gpu_seconds", sa.Float, nullable=False),
)

Key = tuple[tuple[str, Any], ...]
"""A row's primary key as (column, value) pairs."""


def day_of(run: MeteredRun) -> str:
    """The day a run counts on in the charts: the UTC day it ended, ``YYYY-MM-DD``."""
    ended = run.ended if run.ended.tzinfo else run.ended.replace(tzinfo=timezone.utc)
    return ended.astimezone(timezone.utc).date().isoformat()


def additions(runs: Iterable[MeteredRun]) -> dict[sa.Table, dict[Key, dict[str, float]]]:
    """What ``runs`` add to each table: table -> row key -> column -> amount."""
    found: dict[sa.Table, dict[Key, dict[str, float]]] = {monthly: {}, daily: {}}
    for run in runs:
        month_key = (("month", month_of(run.ended)), ("user", run.user), ("cluster_id", run.cluster_id))
        _add(found[monthly], month_key, {"runs": 1, "gpu_seconds": run.gpu_seconds, "cost": run.cost or 0.0,
                                         "unpriced_runs": int(run.cost is None), "preempted": int(run.preempted)})
        for by, key in (("user", run.user), ("donor", run.cluster_id)):
            _add(found[daily], (("by", by), ("day", day_of(run)), ("key", key)), {"gpu_seconds": run.gpu_seconds})
    return found


def _add(rows: dict[Key, dict[str, float]], key: Key, amounts: dict[str, float]) -> None:
    row = rows.setdefault(key, defaultdict(float))
    for column, amount in amounts.items():
        row[column] += amount


def add(conn: sa.Connection, run: MeteredRun) -> None:
    """Add one recorded run to the totals (inside the transaction that records it).

    An update, else an insert: portable across dialects (no upsert syntax). Two writers inserting the same new
    row at once make the second transaction fail with an IntegrityError, which ``Store.record_run`` retries.
    """
    for table, rows in additions([run]).items():
        for key, amounts in rows.items():
            where = [table.c[column] == value for column, value in key]
            changed = conn.execute(table.update().where(*where).values(
                {column: table.c[column] + amount for column, amount in amounts.items()})).rowcount
            if not changed:
                conn.execute(table.insert().values(**dict(key), **amounts))


def missing(conn: sa.Connection, runs: sa.Table) -> bool:
    """Whether the totals fail to account for every recorded run (a database of an older version)."""
    recorded = conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar() or 0
    counted = conn.execute(sa.select(sa.func.sum(monthly.c.runs))).scalar() or 0
    return int(recorded) != int(counted)


def rebuild(conn: sa.Connection, runs: Iterable[MeteredRun]) -> None:
    """Replace the totals with those of ``runs`` (every recorded run)."""
    for table in (monthly, daily):
        conn.execute(table.delete())
    for table, rows in additions(runs).items():
        if rows:
            conn.execute(table.insert(), [{**dict(key), **amounts} for key, amounts in rows.items()])
