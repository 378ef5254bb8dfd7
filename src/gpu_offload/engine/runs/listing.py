"""My runs across all of the user's kernels: this kernel's tracker, the shared state directory, and the runs
the cluster backend sees for the user (its runner pods: runs of kernels elsewhere, or of kernels that crashed,
still show up as long as their pod exists)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backends.base import UserRun, UserRuns
from .records import RunBook, RunEntry, newest_first, pid_alive


def record_of(run: UserRun) -> RunEntry:
    """The run book's record of a run the backend sees (no live kernel is known for it: pid 0)."""
    return RunEntry(
        run_id=run.run_id, kernel=run.kernel, pid=0, backend=run.backend, cluster=run.cluster, gpus=run.gpus,
        state=run.state, detail=run.detail, started=run.started,
        script="" if run.cli else None,  # a CLI run; its command line is not on the pod
    )


@dataclass(frozen=True)
class RunListing:
    """What the runs view shows: records newest first, and sources that could not be read, in words."""

    runs: tuple[RunEntry, ...]
    problems: tuple[str, ...] = ()


def merge(*sources: Iterable[RunEntry]) -> list[RunEntry]:
    """One record per run id; earlier sources win (pass the freshest first)."""
    return newest_first(r for source in sources for r in source)


def list_runs(own: Iterable[RunEntry], book: RunBook, backend: UserRuns | None = None) -> RunListing:
    """This kernel's records, then the state directory's, then the backend's (if a cluster is configured)."""
    stored, problems = book.read_all()
    seen: list[RunEntry] = []
    if backend is not None:
        try:
            seen = [record_of(run) for run in backend.user_runs()]
        except Exception as exc:  # noqa: BLE001 - the cluster being unreachable must not break the panel
            problems.append(f"{backend.where} could not be listed: {exc}")
    return RunListing(tuple(merge(own, stored, seen)), tuple(problems))


def cancellable(record: RunEntry) -> bool:
    """Whether the panel's cancel can still do something for ``record`` (what :func:`cancel_elsewhere` and the
    owning kernel's tracker act on): a run under way whose kernel is alive, or a cluster run whose kernel died
    before it ended (its pod may still hold a GPU)."""
    owner_alive = bool(record.pid) and pid_alive(record.pid)
    if owner_alive:
        return not record.finished
    return record.backend == "kubernetes" and record.ended is None


def cancel_elsewhere(record: RunEntry, book: RunBook, backend: UserRuns | None) -> str:
    """Stop a run this process does not follow: ask its kernel (through the state directory) to interrupt it
    as Ctrl-C would, or, when its kernel is gone, have the backend remove its pod. Says what was done."""
    owner_alive = bool(record.pid) and pid_alive(record.pid)
    if owner_alive and not record.finished:
        book.request_cancel(record.run_id)
        return f"Asked kernel {record.kernel} to interrupt run {record.run_id} (as Ctrl-C would)."
    # a run whose kernel (or background command) died reads as failed, but its pod may still hold a GPU
    removed = (backend.cancel_run(record.run_id)
               if record.backend == "kubernetes" and backend is not None and not owner_alive else [])
    if removed:
        return f"Run {record.run_id} had no live kernel; deleted {', '.join(removed)}."
    if record.finished:
        return f"Run {record.run_id} has already ended ({record.state})."
    return f"Run {record.run_id} has no live kernel left to interrupt."
