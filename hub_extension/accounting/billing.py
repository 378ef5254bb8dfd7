"""The billing export: one CSV line per finished run, with its price and cost as recorded. Pure.

Values come from pods and namespaces (user names, pod names), which users and donors can choose, and a CSV
is opened in spreadsheets: a cell starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return would be
read as a formula, so such text is prefixed with ``'`` (OWASP's advice on CSV injection). Numbers are
written as numbers.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator

from .cost import month_of
from .usage import MeteredRun

COLUMNS = ("month", "user", "cluster_id", "node", "namespace", "pod", "pod_uid", "gpus", "started", "ended",
           "phase", "gpu_hours", "price_per_gpu_hour", "cost")
MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])", re.ASCII)
"""A billing month as the API takes it: ``YYYY-MM``."""
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def inert(text: str) -> str:
    """``text`` as a spreadsheet shows it, never evaluates it."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}".rstrip("0").rstrip(".")


def row(run: MeteredRun) -> list[str]:
    """One run's line (empty price and cost: not priced)."""
    return [month_of(run.ended), inert(run.user), inert(run.cluster_id), inert(run.node), inert(run.namespace),
            inert(run.pod), inert(run.pod_uid), str(run.gpus), run.started.isoformat(), run.ended.isoformat(),
            inert(run.phase), _number(run.gpu_seconds / 3600), _number(run.price_per_gpu_hour), _number(run.cost)]


def csv_chunks(runs: Iterable[MeteredRun], lines_per_chunk: int = 500) -> Iterator[str]:
    """The CSV (header first), in chunks of lines, so a long export is written as it is read."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    for count, run in enumerate(runs, 1):
        writer.writerow(row(run))
        if count % lines_per_chunk == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()
