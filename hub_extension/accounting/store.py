"""The service's database: finished runs (GPU usage and cost), the price book and the audit log. SQLite by
default, any SQLAlchemy URL.

Runs are keyed by pod uid and inserted only when absent, so the watcher may see a pod end twice (a
terminal phase, then its deletion; or again after a restart re-lists it) without counting it twice; and a
run's price and cost are written once, with the run, so a later price change never rewrites them.

What the pages sum (totals per user, donor, month and day) is kept as running totals beside the runs,
written in the same transaction (``rollups.py``), so a view reads a few thousand rows, not every run.

Schema changes are additive: a column added to a table here is added to an existing database when the
service opens it (``_add_missing_columns``), nullable or with its server default, so an older database
keeps working and its old rows read as "not priced".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from . import rollups
from .cost import PricePoint, month_of
from .usage import MeteredRun

_metadata = sa.MetaData()
_runs = sa.Table(
    "gpu_offload_runs",
    _metadata,
    sa.Column("pod_uid", sa.String(64), primary_key=True),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("pod", sa.String(253), nullable=False),
    sa.Column("user", sa.String(255), nullable=False, index=True),
    sa.Column("cluster_id", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("started", sa.DateTime(timezone=True), nullable=False),
    sa.Column("ended", sa.DateTime(timezone=True), nullable=False),
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("gpu_seconds", sa.Float, nullable=False),
    # added for cost (issue 17): nullable, so rows of an older database read as not priced
    sa.Column("month", sa.String(7), nullable=True, index=True),
    sa.Column("price_per_gpu_hour", sa.Float, nullable=True),
    sa.Column("cost", sa.Float, nullable=True),
    # added for preemption (issue 15): Kueue stopped the run for a higher-priority one
    sa.Column("preempted", sa.Boolean, nullable=False, server_default=sa.false()),
    # added for fractions (issue 28): part of one GPU held; NULL for whole GPUs
    sa.Column("share", sa.Float, nullable=True),
)
_prices = sa.Table(
    "gpu_offload_prices",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cluster_id", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("since", sa.DateTime(timezone=True), nullable=False),
    sa.Column("price", sa.Float, nullable=True),
    sa.Index("gpu_offload_prices_node", "cluster_id", "node", "since"),
)
_samples = sa.Table(
    # added for the donors' charts (issue 17): GPUs of each donor as the inventory showed them at ``at``
    "gpu_offload_inventory_samples",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("cluster_id", sa.String(253), nullable=False),
    sa.Column("gpus_total", sa.Integer, nullable=False),
    sa.Column("gpus_free", sa.Integer, nullable=False),
    sa.Column("gpus_in_use", sa.Integer, nullable=False),
    sa.Index("gpu_offload_inventory_samples_cluster", "cluster_id", "at"),
    sa.Index("gpu_offload_inventory_samples_at", "at"),  # the retention's delete, without a scan
)
_sightings = sa.Table(
    # added for issue 20: when the meter first saw a live pod Running, kept across restarts until the run is
    # recorded (the donor's own start times are not believed)
    "gpu_offload_running_seen",
    _metadata,
    sa.Column("pod_uid", sa.String(64), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)
_audit = sa.Table(
    "gpu_offload_audit",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("who", sa.String(255), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("target", sa.String(512), nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("ok", sa.Boolean, nullable=False),
)


@dataclass(frozen=True)
class UsageTotal:
    """GPU-hours one user spent on one cluster, and what they cost."""

    user: str
    cluster_id: str
    runs: int
    gpu_hours: float
    cost: float = 0.0
    """Sum over the priced runs."""
    unpriced_runs: int = 0
    """Runs without a price (an unpriced donor, or recorded before prices were): not in ``cost``."""
    preempted: int = 0
    """Runs Kueue preempted to make room for a higher priority."""


@dataclass(frozen=True)
class CostRow:
    """GPU-hours and cost of one user, one donor or one month."""

    key: str
    """The user, the cluster id or the month (``YYYY-MM``)."""
    runs: int
    gpu_hours: float
    cost: float
    unpriced_runs: int


GROUPS = {"user": "user", "donor": "cluster_id", "month": "month"}
"""What ``Store.costs`` groups by, and the column it reads."""


@dataclass(frozen=True)
class GpuSample:
    """A donor's GPUs at one moment, as the inventory (and the clusters page) counted them."""

    at: datetime
    cluster_id: str
    gpus_total: int
    gpus_free: int
    gpus_in_use: int


@dataclass(frozen=True)
class AuditEntry:
    """One admin action: who did what, when, and how it ended (in words)."""

    at: datetime
    who: str
    action: str
    target: str
    result: str
    ok: bool


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes even for timezone-aware columns.
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


class Store:
    """Usage records and audit entries in one database (tables are created when missing)."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, future=True)
        for metadata in (_metadata, rollups.metadata):
            metadata.create_all(self.engine)
        _add_missing_columns(self.engine)
        with self.engine.begin() as conn:  # a database of an older version: its runs are not in the totals yet
            if rollups.missing(conn, _runs):
                rollups.rebuild(conn, (_run(r) for r in conn.execute(sa.select(_runs))))
        self.generation = 0
        """Runs recorded by this process: views of the runs may be cached until it changes."""
        self._prices_lock = threading.Lock()  # the price recorder and the pod watch both note prices
        self._last_price: dict[tuple[str, str], float | None] = self._latest_prices()

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def record_run(self, run: MeteredRun) -> bool:
        """Store a finished run; False when that pod uid was already recorded (nothing changes)."""
        row = {
            "pod_uid": run.pod_uid, "namespace": run.namespace, "pod": run.pod, "user": run.user,
            "cluster_id": run.cluster_id, "node": run.node, "gpus": run.gpus, "started": run.started,
            "ended": run.ended, "phase": run.phase, "gpu_seconds": run.gpu_seconds, "month": month_of(run.ended),
            "price_per_gpu_hour": run.price_per_gpu_hour, "cost": run.cost, "preempted": run.preempted,
            "share": run.share,
        }
        for attempt in range(3):
            try:
                with self.engine.begin() as conn:
                    conn.execute(_runs.insert().values(**row))
                    rollups.add(conn, run)
                    conn.execute(_sightings.delete().where(_sightings.c.pod_uid == run.pod_uid))
                break
            except IntegrityError:
                if self._recorded(run.pod_uid):
                    return False
                if attempt == 2:  # not the run: another writer kept creating the same totals row
                    raise
        self.generation += 1
        return True

    def saw_running(self, pod_uid: str, at: datetime) -> datetime:
        """Note that the meter saw the pod Running at ``at``, unless it saw it earlier; the first sighting."""
        first = self.running_seen(pod_uid)
        if first is not None:
            return first
        try:
            with self.engine.begin() as conn:
                conn.execute(_sightings.insert().values(pod_uid=pod_uid, at=at))
        except IntegrityError:  # another writer's sighting came first: it stands
            pass
        return self.running_seen(pod_uid) or at

    def running_seen(self, pod_uid: str) -> datetime | None:
        """When the meter first saw the pod Running, if it did and the run is not recorded yet."""
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(_sightings.c.at).where(_sightings.c.pod_uid == pod_uid)).scalar()
        return _utc(found) if found is not None else None

    def forget_running(self, pod_uid: str) -> None:
        """Drop the sighting of a pod that is gone without a run to record."""
        with self.engine.begin() as conn:
            conn.execute(_sightings.delete().where(_sightings.c.pod_uid == pod_uid))

    def _recorded(self, pod_uid: str) -> bool:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(_runs.c.pod_uid).where(_runs.c.pod_uid == pod_uid)).first() is not None

    def totals(self, user: str | None = None) -> list[UsageTotal]:
        """GPU-hours, cost and preemptions per user and cluster (one user's only, when given), largest first."""
        m = rollups.monthly
        query = sa.select(m.c.user, m.c.cluster_id, *_sums(),
                          sa.func.sum(m.c.preempted).label("preempted")).group_by(m.c.user, m.c.cluster_id)
        if user is not None:
            query = query.where(m.c.user == user)
        with self.engine.connect() as conn:
            rows: list[Any] = list(conn.execute(query).all())
        # positional unpacking: a Row's attributes cost more than the rest of the page's thousands of rows
        totals = [UsageTotal(u, c, int(n), float(s or 0) / 3600, float(cost or 0), int(unpriced or 0), int(pre or 0))
                  for u, c, n, s, cost, unpriced, pre in rows]
        return sorted(totals, key=lambda t: (-t.gpu_hours, t.user, t.cluster_id))

    def costs(self, by: str, month: str | None = None, user: str | None = None) -> list[CostRow]:
        """GPU-hours and cost per ``by`` (``user``, ``donor`` or ``month``), of one month and one user when given;
        largest cost first (months: newest first)."""
        m = rollups.monthly
        column = m.c[GROUPS[by]]
        query = sa.select(column.label("key"), *_sums()).group_by(column)
        if month is not None:
            query = query.where(m.c.month == month)
        if user is not None:
            query = query.where(m.c.user == user)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        found = [CostRow(str(k or ""), int(n), float(s or 0) / 3600, float(cost or 0), int(unpriced or 0))
                 for k, n, s, cost, unpriced in rows]
        if by == "month":
            return sorted(found, key=lambda c: c.key, reverse=True)
        return sorted(found, key=lambda c: (-c.cost, -c.gpu_hours, c.key))

    def spend(self, user: str, month: str) -> CostRow:
        """What ``user`` spent in ``month`` (``YYYY-MM``), keyed by the month: zeros when nothing."""
        found = self.costs("month", month=month, user=user)
        return found[0] if found else CostRow(month, 0, 0.0, 0.0, 0)

    def runs(self, user: str, limit: int = 100) -> list[MeteredRun]:
        """A user's most recent finished runs."""
        query = sa.select(_runs).where(_runs.c.user == user).order_by(_runs.c.ended.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [_run(r) for r in conn.execute(query).all()]

    def daily(self, by: str, since: datetime, user: str | None = None) -> list[tuple[str, str, float]]:
        """(day ``YYYY-MM-DD``, user or donor, GPU-seconds) of the runs (one user's, when given) that ended at or
        after ``since`` (a UTC midnight), summed per day (the day a run ended, UTC): the daily charts. Everyone's
        from the daily totals; one user's from their runs (the totals are not per user and donor)."""
        query: sa.Select[Any]
        if user is None:
            d = rollups.daily
            query = sa.select(d.c.day, d.c.key, d.c.gpu_seconds).where(
                d.c.by == by, d.c.day >= since.astimezone(timezone.utc).date().isoformat())
        else:
            column = _runs.c[GROUPS[by]]
            day = sa.func.date(_runs.c.ended)  # the column holds UTC
            query = (sa.select(day, column, sa.func.sum(_runs.c.gpu_seconds))
                     .where(_runs.c.ended >= since, _runs.c.user == user).group_by(day, column))
        with self.engine.connect() as conn:
            rows: list[Any] = list(conn.execute(query).all())
        return [(str(day), str(key or ""), float(s or 0)) for day, key, s in rows]

    def export(self, month: str | None = None) -> Iterator[MeteredRun]:
        """Every finished run (of one month when given), oldest first: what the billing CSV lists."""
        query = sa.select(_runs).order_by(_runs.c.ended, _runs.c.pod_uid)
        if month is not None:
            query = query.where(_runs.c.month == month)
        with self.engine.connect() as conn:
            for row in conn.execute(query):
                yield _run(row)

    # --- the price book (cost.py says how it prices a run) ---

    def note_prices(self, prices: Mapping[tuple[str, str], float | None], at: datetime) -> int:
        """Write down each (cluster id, node) price that differs from the last noted one, as in force since
        ``at``; returns how many were noted."""
        with self._prices_lock:
            changed = [(key, price) for key, price in prices.items()
                       if key not in self._last_price or self._last_price[key] != price]
            if not changed:
                return 0
            with self.engine.begin() as conn:
                conn.execute(_prices.insert(), [{"cluster_id": c, "node": n, "since": at, "price": p}
                                                for (c, n), p in changed])
            self._last_price.update(changed)
            return len(changed)

    def price_book(self, cluster_id: str, node: str) -> list[PricePoint]:
        """Every price noted for one virtual node, oldest first."""
        query = (sa.select(_prices.c.since, _prices.c.price)
                 .where(_prices.c.cluster_id == cluster_id, _prices.c.node == node)
                 .order_by(_prices.c.since, _prices.c.id))
        with self.engine.connect() as conn:
            return [PricePoint(_utc(r.since), r.price) for r in conn.execute(query)]

    def _latest_prices(self) -> dict[tuple[str, str], float | None]:
        query = sa.select(_prices.c.cluster_id, _prices.c.node, _prices.c.price).order_by(_prices.c.since,
                                                                                            _prices.c.id)
        with self.engine.connect() as conn:
            return {(r.cluster_id, r.node): r.price for r in conn.execute(query)}

    # --- inventory samples (sampling.py takes them, the cluster page charts them) ---

    def add_samples(self, samples: Sequence[GpuSample], keep_since: datetime | None = None) -> None:
        """Store ``samples`` and drop every sample older than ``keep_since`` when given (the retention)."""
        with self.engine.begin() as conn:
            if samples:
                conn.execute(_samples.insert(), [
                    {"at": s.at, "cluster_id": s.cluster_id, "gpus_total": s.gpus_total, "gpus_free": s.gpus_free,
                     "gpus_in_use": s.gpus_in_use} for s in samples])
            if keep_since is not None:
                conn.execute(_samples.delete().where(_samples.c.at < keep_since))

    def samples(self, cluster_id: str, since: datetime) -> list[GpuSample]:
        """One donor's samples taken at or after ``since``, oldest first."""
        query = (sa.select(_samples).where(_samples.c.cluster_id == cluster_id, _samples.c.at >= since)
                 .order_by(_samples.c.at, _samples.c.id))
        with self.engine.connect() as conn:
            return [GpuSample(_utc(r.at), r.cluster_id, r.gpus_total, r.gpus_free, r.gpus_in_use)
                    for r in conn.execute(query)]

    def audit(self, who: str, action: str, target: str, result: str, ok: bool) -> AuditEntry:
        """Append one audit entry (timestamped now) and return it."""
        entry = AuditEntry(datetime.now(timezone.utc), who, action, target, result, ok)
        with self.engine.begin() as conn:
            conn.execute(_audit.insert().values(
                at=entry.at, who=who, action=action, target=target, result=result, ok=ok
            ))
        return entry

    def audit_log(self, limit: int = 200) -> Sequence[AuditEntry]:
        """The most recent audit entries, newest first."""
        query = sa.select(_audit).order_by(_audit.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [AuditEntry(_utc(r.at), r.who, r.action, r.target, r.result, r.ok) for r in rows]


def _sums() -> list[Any]:
    m = rollups.monthly
    return [sa.func.sum(m.c.runs).label("runs"), sa.func.sum(m.c.gpu_seconds).label("seconds"),
            sa.func.sum(m.c.cost).label("cost"), sa.func.sum(m.c.unpriced_runs).label("unpriced")]


def _run(r: Any) -> MeteredRun:
    return MeteredRun(r.pod_uid, r.namespace, r.pod, r.user, r.cluster_id, r.node, r.gpus, _utc(r.started),
                      _utc(r.ended), r.phase, r.price_per_gpu_hour, r.cost, bool(r.preempted), r.share)


def _add_missing_columns(engine: sa.Engine) -> None:
    """Bring a database made by an older version up to this schema: add the columns it lacks (nullable or
    with their server default, so old rows stay valid), their indexes, and fill in derived values."""
    inspector = sa.inspect(engine)
    for table in (*_metadata.sorted_tables, *rollups.metadata.sorted_tables):
        present = {c["name"] for c in inspector.get_columns(table.name)}
        missing = [c for c in table.columns if c.name not in present]
        if not missing:
            continue
        with engine.begin() as conn:
            for column in missing:
                kind = column.type.compile(dialect=engine.dialect)
                default = f" DEFAULT {column.server_default.arg}" if column.server_default is not None else ""  # type: ignore[attr-defined]
                name = engine.dialect.identifier_preparer.quote(column.name)
                conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind}{default}"))
            for index in table.indexes:
                if any(c in missing for c in index.columns):
                    index.create(conn, checkfirst=True)
            if table is _runs and _runs.c.month in missing:
                _fill_months(conn)


def _fill_months(conn: sa.Connection) -> None:
    # the billing month of runs recorded before it existed, from their end (computed here: SQL dialects differ)
    rows = conn.execute(sa.select(_runs.c.pod_uid, _runs.c.ended)).all()
    for row in rows:
        conn.execute(_runs.update().where(_runs.c.pod_uid == row.pod_uid).values(month=month_of(_utc(row.ended))))
