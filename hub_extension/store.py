"""The service's database: finished runs (GPU usage) and the audit log. SQLite by default, any SQLAlchemy URL.

Runs are keyed by pod uid and inserted only when absent, so the watcher may see a pod end twice (a
terminal phase, then its deletion; or again after a restart re-lists it) without counting it twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

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
    sa.Column("preempted", sa.Boolean, nullable=False, server_default=sa.false()),
)
ADDED_COLUMNS = {"preempted": "BOOLEAN NOT NULL DEFAULT FALSE"}
"""Columns added after the first release: a database made before them gets them at start."""
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
    """GPU-hours one user spent on one cluster."""

    user: str
    cluster_id: str
    runs: int
    gpu_hours: float
    preempted: int = 0
    """Runs Kueue preempted to make room for a higher priority."""


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
        _metadata.create_all(self.engine)
        self._add_columns()

    def _add_columns(self) -> None:
        """Bring a usage table made by an earlier version up to date (create_all leaves existing tables alone)."""
        present = {c["name"] for c in sa.inspect(self.engine).get_columns(_runs.name)}
        with self.engine.begin() as conn:
            for name, ddl in ADDED_COLUMNS.items():
                if name not in present:
                    conn.execute(sa.text(f"ALTER TABLE {_runs.name} ADD COLUMN {name} {ddl}"))

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def record_run(self, run: MeteredRun) -> bool:
        """Store a finished run; False when that pod uid was already recorded (nothing changes)."""
        row = {
            "pod_uid": run.pod_uid, "namespace": run.namespace, "pod": run.pod, "user": run.user,
            "cluster_id": run.cluster_id, "node": run.node, "gpus": run.gpus, "started": run.started,
            "ended": run.ended, "phase": run.phase, "gpu_seconds": run.gpu_seconds, "preempted": run.preempted,
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(_runs.insert().values(**row))
        except IntegrityError:
            return False
        return True

    def totals(self, user: str | None = None) -> list[UsageTotal]:
        """GPU-hours per user and cluster (one user's only, when given), largest first."""
        query = sa.select(
            _runs.c.user, _runs.c.cluster_id, sa.func.count().label("runs"),
            sa.func.sum(_runs.c.gpu_seconds).label("seconds"),
            sa.func.sum(sa.case((_runs.c.preempted, 1), else_=0)).label("preempted"),
        ).group_by(_runs.c.user, _runs.c.cluster_id)
        if user is not None:
            query = query.where(_runs.c.user == user)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        totals = [UsageTotal(r.user, r.cluster_id, int(r.runs), float(r.seconds or 0) / 3600, int(r.preempted or 0))
                  for r in rows]
        return sorted(totals, key=lambda t: (-t.gpu_hours, t.user, t.cluster_id))

    def runs(self, user: str, limit: int = 100) -> list[MeteredRun]:
        """A user's most recent finished runs."""
        query = sa.select(_runs).where(_runs.c.user == user).order_by(_runs.c.ended.desc()).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            MeteredRun(r.pod_uid, r.namespace, r.pod, r.user, r.cluster_id, r.node, r.gpus, _utc(r.started),
                      _utc(r.ended), r.phase, bool(r.preempted))
            for r in rows
        ]

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
