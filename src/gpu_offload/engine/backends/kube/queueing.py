"""Waiting in Kueue's queue as the kernel shows it: the place in line is read from Kueue, never computed here.

One :class:`QueueWatch` per kernel, started by its first queued run: a list/watch (``liqo_peering.watching``)
of the one ClusterQueue behind the kernel's LocalQueue, whose status changes whenever Kueue queues, admits or
finishes a run anywhere in the pool; a change wakes one read of Kueue's visibility API (the LocalQueue's
pending workloads, then the namespace's Workloads for Kueue's reason), and that one read serves every queued
run of the kernel. Reads are spaced by the
project's backoff (about 1, 2, 4 ... then every 30 s while runs keep waiting), so a long wait costs a few
requests a minute at most; with nothing changing, runs that wait are read every 30 s anyway (a Kueue that
stopped changes nothing, and its visibility API's 503 is said in the place of the place in line). Without
read access to the ClusterQueue the spacing alone paces the reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from ....liqo_peering.errors import APIError, APIForbidden
from ....liqo_peering.queue_client import KueueClient
from ....liqo_peering.retrying import WATCH_BACKOFF, Backoff
from ....liqo_peering.watching import Event, ListResult, ListWatch
from ....liqo_peering.wording import duration, ordinal
from .wait_estimate import QUEUED_KINDS, RECENT, UNKNOWN, estimate, reason_of, waiting_messages

READ_SPACING = Backoff(first=1.0, cap=30.0, factor=2.0, jitter=0.2)
"""The wait between two reads of the pending workloads while runs keep waiting (the n-th read of a wait)."""
QUIET_READ_SECONDS = 30.0
"""How long runs wait with nothing changing in the pool before their place is read anyway: a Kueue that stopped
changes nothing, and its visibility API's 503 is then said instead of a place that no longer moves."""
FIRST_LIST_SECONDS = 10.0
"""How long a launch waits for the ClusterQueue's first listing (for the never-fits check)."""


class Ticket:
    """One queued pod's place in line, as the last read of Kueue said (updated from the watch's thread)."""

    def __init__(self, pod: str, what: str, queue: str) -> None:
        self.pod = pod
        self.what = what
        """What the run waits for, e.g. ``2 x A100`` or ``1 GPU``."""
        self.queue = queue
        self.since = time.monotonic()
        self.position: int | None = None
        """Place in the ClusterQueue from 0 (Kueue's ``positionInClusterQueue``); None: not listed as pending."""
        self.total: int | None = None
        """Pending workloads of the ClusterQueue (its status), when readable."""
        self.version = 0
        """Bumped whenever position or total change."""
        self.admissions: tuple[float, ...] = ()
        """When runs ahead left the line, as the kernel saw it (monotonic clock; the last few only)."""
        self.watched_since = self.since
        """Since when the kernel has been counting those departures."""
        self.message = ""
        """Why Kueue holds it back, in Kueue's words (its Workload's QuotaReserved condition); empty: not read."""
        self.trouble = ""
        """Why the place in line cannot be read right now (Kueue down); empty once a read answers."""

    def update(self, position: int | None, total: int | None, admissions: tuple[float, ...] = (),
               watched_since: float | None = None, message: str | None = None) -> None:
        self.admissions = admissions
        if watched_since is not None:
            self.watched_since = watched_since
        if message is None:  # not read this time: the last one stands
            message = self.message
        if (position, total, message) != (self.position, self.total, self.message) or self.trouble:
            self.position, self.total, self.message, self.trouble = position, total, message, ""
            self.version += 1

    def unreadable(self, exc: APIError) -> None:
        """The place in line could not be read: say so, naming the likely cause and what happens to the run."""
        if exc.status == 503:
            trouble = (f"Kueue's visibility API does not answer (HTTP 503: {exc.detail}): Kueue is down or restarting. "
                       "The run keeps its place and starts once Kueue admits it; if this lasts, ask your cluster "
                       "admin to check Kueue's controller")
        else:
            trouble = f"the place in line cannot be read: {exc}"
        if trouble != self.trouble:
            self.trouble = trouble
            self.version += 1

    def text(self, now: float | None = None) -> str:
        """``queued for 2 x A100: 4th of 9 in line; waiting 1 min 12 s``."""
        waited = duration((time.monotonic() if now is None else now) - self.since)
        if self.trouble:
            return f"queued for {self.what} in LocalQueue {self.queue}; waiting {waited}\n  {self.trouble}"
        said = f"\n  Kueue: {self.message}" if self.message else ""
        if self.position is None:
            return f"queued for {self.what} in LocalQueue {self.queue}; waiting {waited}{said}"
        place = ordinal(self.position + 1)
        line = f"{place} of {self.total}" if self.total is not None and self.total > self.position else place
        guess = estimate(self.position, self.admissions, self.watched_since,
                         time.monotonic() if now is None else now,
                         reason_of(self.message) if self.message else UNKNOWN)
        return f"queued for {self.what}: {line} in line; waiting {waited}{said}\n  {guess.text()}"


def _owner_pod(item: Mapping[str, Any]) -> str | None:
    """The name of the pod, or of a distributed run's Job, whose Workload ``item`` is (tickets are kept by it)."""
    for ref in (item.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") in QUEUED_KINDS:
            return str(ref.get("name"))
    return None


class QueueWatch:
    """The kernel's view of its LocalQueue: the ClusterQueue behind it and the place in line of each queued pod."""

    def __init__(self, kueue: KueueClient, namespace: str, local_queue: str, cluster_queue: str,
                 spacing: Backoff = READ_SPACING) -> None:
        self.kueue = kueue
        self.namespace = namespace
        self.local_queue = local_queue
        self.cluster_queue_name = cluster_queue
        self._spacing = spacing
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._tickets: dict[str, Ticket] = {}
        self._cluster_queue: dict[str, Any] | None = None
        self._listed = threading.Event()
        self._blind = False
        """The ClusterQueue cannot be read: reads are paced by the spacing alone."""
        self._no_reasons = False
        """The namespace's Workloads cannot be read (a chart without the users' read of them): no Kueue reason."""
        self._changed = False
        self._fresh = False
        """A run joined the line: the next read comes soon, whatever the spacing had grown to."""
        self._stop = threading.Event()
        self.reads = 0
        """Reads of the pending workloads so far (for the bench)."""
        self._departures: deque[float] = deque(maxlen=RECENT + 1)
        """When runs ahead of a followed one left the line (admitted or withdrawn), one entry per run."""
        self._since = time.monotonic()
        self._watch = ListWatch(f"ClusterQueue {cluster_queue}", self._list, self._watch_events, self,
                                backoff=WATCH_BACKOFF)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"gpu-offload-queue-{local_queue}")

    def start(self) -> QueueWatch:
        self._watch.start()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        self._watch.close(timeout=1.0)

    # --- the ClusterQueue, through the project's list/watch loop ---

    def _list(self) -> ListResult:
        return self.kueue.cluster_queue(self.cluster_queue_name).list(30.0)

    def _watch_events(self, version: str, seconds: int, stream: Any) -> Any:
        return self.kueue.cluster_queue(self.cluster_queue_name).watch(version, seconds, stream)

    def listed(self, result: ListResult) -> None:
        self._seen(result.items[0] if result.items else None)
        self._listed.set()

    def event(self, event: Event) -> None:
        if event.get("type") in ("ADDED", "MODIFIED"):
            self._seen(event["object"])
        elif event.get("type") == "DELETED":
            self._seen(None)

    def failed(self, exc: Exception) -> None:
        if isinstance(exc, APIForbidden):
            with self._lock:
                self._blind = True
                self._wake.notify_all()
            # it would only be refused again: the reads go on without it (closed from another thread, as this
            # one is the watch's own)
            threading.Thread(target=self._watch.close, daemon=True).start()
        self._listed.set()

    def _seen(self, cluster_queue: dict[str, Any] | None) -> None:
        with self._lock:
            self._cluster_queue = cluster_queue
            self._changed = True
            self._wake.notify_all()

    def cluster_queue(self, timeout: float = FIRST_LIST_SECONDS) -> dict[str, Any] | None:
        """The ClusterQueue as last seen (waiting up to ``timeout`` for a first listing); None when unreadable."""
        self._listed.wait(timeout)
        with self._lock:
            return self._cluster_queue

    # --- tickets and the reads of the visibility API ---

    def track(self, pod: str, what: str) -> Ticket:
        """Start following ``pod``'s place in line; the next read comes soon."""
        ticket = Ticket(pod, what, self.local_queue)
        with self._lock:
            if not self._tickets:
                # no run was followed since the last wait: nothing was counted meanwhile, so the pace starts anew
                self._departures.clear()
                self._since = time.monotonic()
            self._tickets[pod] = ticket
            self._changed = self._fresh = True
            self._wake.notify_all()
        return ticket

    def forget(self, ticket: Ticket) -> None:
        """Stop following the ticket's pod (admitted, withdrawn or ended)."""
        with self._lock:
            self._tickets.pop(ticket.pod, None)

    def _total(self) -> int | None:
        status = (self._cluster_queue or {}).get("status") or {}
        value = status.get("pendingWorkloads")
        return int(value) if isinstance(value, int) else None

    def _run(self) -> None:
        reads_in_row = 0
        next_read = 0.0
        failures = 0
        last_read = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                while not self._stop.is_set() and not (self._tickets and (
                        self._changed or self._blind or time.monotonic() - last_read >= QUIET_READ_SECONDS)):
                    if not self._tickets:
                        reads_in_row = 0  # the next wait starts with quick reads again
                    quiet = last_read + QUIET_READ_SECONDS - time.monotonic() if self._tickets else 30.0
                    self._wake.wait(max(0.1, min(30.0, quiet)))
                self._changed = False
                if self._fresh:
                    self._fresh, reads_in_row = False, 0
                    next_read = min(next_read, time.monotonic() + self._spacing.delay(1))
            pause = next_read - time.monotonic()
            if pause > 0 and self._stop.wait(pause):
                return
            last_read = time.monotonic()
            try:
                items = self.kueue.pending_workloads(self.namespace, self.local_queue)
            except APIError as exc:
                failures += 1
                with self._lock:
                    self._changed = True  # still to be read
                    for ticket in self._tickets.values():
                        ticket.unreadable(exc)
                if self._stop.wait(WATCH_BACKOFF.delay(failures)):
                    return
                continue
            failures = 0
            self.reads += 1
            reads_in_row += 1
            next_read = time.monotonic() + self._spacing.delay(reads_in_row)
            positions = {_owner_pod(item): item.get("positionInClusterQueue") for item in items}
            self._read(positions, self._reasons())

    def _reasons(self) -> dict[str, str] | None:
        """Kueue's reason for each held-back pod of the namespace; None when not read this time."""
        if self._no_reasons:
            return None
        try:
            return waiting_messages(self.kueue.workloads(self.namespace))
        except APIForbidden:
            self._no_reasons = True  # it would only be refused again: the place in line is shown without it
        except APIError:
            pass  # the next read tries again; the last reason stands meanwhile
        return None

    def _read(self, positions: Mapping[str | None, Any], messages: Mapping[str, str] | None = None) -> None:
        """Apply one read of the pending workloads to the tickets; count the runs that left the line since the
        last read (the most any followed run moved up: a run that left counts itself and those ahead)."""
        now = time.monotonic()
        with self._lock:
            total = self._total()
            left = 0
            news = {}
            for pod, ticket in self._tickets.items():
                found = positions.get(pod)
                news[pod] = position = found if isinstance(found, int) else None
                if ticket.position is not None:
                    left = max(left, ticket.position - (position if position is not None else -1))
            self._departures.extend([now] * left)
            seen = tuple(self._departures)
            for pod, ticket in self._tickets.items():
                message = None if messages is None else messages.get(pod, "")
                ticket.update(news[pod], total, seen, self._since, message)
