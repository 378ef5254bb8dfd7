"""My runs across all of the user's kernels: this kernel's tracker, the shared state directory, and the
runner pods labelled with the user's name in the user's namespace (runs of kernels elsewhere, or of kernels
that crashed, still show up as long as their pod exists)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...liqo_peering import labels as L
from ...liqo_peering.inventory import pod_gpus
from ...liqo_peering.specs import runner_selector
from ...liqo_peering.timestamps import parse_time
from ..backends.kube.pods import PodApi
from .records import RunBook, RunEntry, newest_first, pid_alive

_PHASES = {"Pending": "scheduling", "Running": "running", "Succeeded": "done", "Failed": "failed"}


def _timestamp(value: str | None) -> float:
    if not value:
        return time.time()
    stamp = parse_time(value)
    return time.time() if stamp is None else stamp.timestamp()


def _pod_cluster(pod: Mapping[str, Any]) -> str:
    """The remote cluster id from the pod's required node affinity (placement writes it there)."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == L.REMOTE_CLUSTER_ID_LABEL and expr.get("values"):
                return str(expr["values"][0])
    return "auto"


def _waiting_reason(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled yet")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason") or "waiting")
    return ""


def record_from_pod(pod: Mapping[str, Any]) -> RunEntry | None:
    """The run a runner pod stands for (pure); ``None`` for a pod without a run-id label."""
    meta = pod.get("metadata") or {}
    found = meta.get("labels") or {}
    run_id = found.get(L.RUN_ID)
    if not run_id:
        return None
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    return RunEntry(
        run_id=str(run_id), kernel=str(found.get(L.KERNEL, "?")), pid=0, backend="kubernetes",
        cluster=_pod_cluster(pod), gpus=pod_gpus(pod), state=_PHASES.get(phase, "scheduling"),
        detail=f"pod {meta.get('name')}" + (f": {_waiting_reason(pod)}" if phase == "Pending" else ""),
        started=_timestamp(meta.get("creationTimestamp")),
        script="" if found.get(L.ORIGIN) == L.ORIGIN_CLI else None,  # a CLI run; its command line is not on the pod
    )


class RunnerPods(PodApi):
    """Lists the user's runner pods (the one extra call the panel makes beyond the backend's own)."""

    def runs(self, user: str) -> list[RunEntry]:
        """Records of the user's runner pods in this namespace."""
        return [r for r in (record_from_pod(p) for p in self.list_pods(runner_selector(user))) if r is not None]


@dataclass(frozen=True)
class RunListing:
    """What the runs view shows: records newest first, and sources that could not be read, in words."""

    runs: tuple[RunEntry, ...]
    problems: tuple[str, ...] = ()


def merge(*sources: Iterable[RunEntry]) -> list[RunEntry]:
    """One record per run id; earlier sources win (pass the freshest first)."""
    return newest_first(r for source in sources for r in source)


def list_runs(own: Iterable[RunEntry], book: RunBook, pods: RunnerPods | None = None,
              user: str | None = None) -> RunListing:
    """This kernel's records, then the state directory's, then the pods' (if a namespace is configured)."""
    stored, problems = book.read_all()
    from_pods: list[RunEntry] = []
    if pods is not None and user:
        try:
            from_pods = pods.runs(user)
        except Exception as exc:  # noqa: BLE001 - the cluster being unreachable must not break the panel
            problems.append(f"runner pods in {pods.namespace} could not be listed: {exc}")
    return RunListing(tuple(merge(own, stored, from_pods)), tuple(problems))


def cancellable(record: RunEntry) -> bool:
    """Whether the panel's cancel can still do something for ``record`` (what :func:`cancel_elsewhere` and the
    owning kernel's tracker act on): a run under way whose kernel is alive, or a cluster run whose kernel died
    before it ended (its pod may still hold a GPU)."""
    owner_alive = bool(record.pid) and pid_alive(record.pid)
    if owner_alive:
        return not record.finished
    return record.backend == "kubernetes" and record.ended is None


def cancel_elsewhere(record: RunEntry, book: RunBook, pods: RunnerPods | None, user: str | None) -> str:
    """Stop a run this process does not follow: ask its kernel (through the state directory) to interrupt it
    as Ctrl-C would, or, when its kernel is gone, delete its pod. Says what was done."""
    owner_alive = bool(record.pid) and pid_alive(record.pid)
    if owner_alive and not record.finished:
        book.request_cancel(record.run_id)
        return f"Asked kernel {record.kernel} to interrupt run {record.run_id} (as Ctrl-C would)."
    # a run whose kernel (or background command) died reads as failed, but its pod may still hold a GPU
    removed = (pods.delete_matching(runner_selector(user, run_id=record.run_id))
               if record.backend == "kubernetes" and pods is not None and not owner_alive else [])
    if removed:
        return f"Run {record.run_id} had no live kernel; deleted {', '.join(removed)}."
    if record.finished:
        return f"Run {record.run_id} has already ended ({record.state})."
    return f"Run {record.run_id} has no live kernel left to interrupt."
