"""The Kueue controller of the sandbox: one loop that reacts to pods, Jobs and Kueue objects (and ticks for
timeouts), as Kueue's reconcilers and scheduler together would.

Each pass: create missing Workloads (``sync``); mark finished ones; release the quota of evicted Workloads
whose pods are gone (``Requeued``, ``QuotaReserved=False``); evict admitted Workloads that miss
``waitForPodsReady``; end the requeue backoff; run a scheduling cycle per ClusterQueue (``cycle``); write
ClusterQueue and LocalQueue status. Admission Fair Sharing keeps, per LocalQueue, a decayed usage sampled
every ``usage_sampling`` seconds plus the entry penalty of admissions since the last sample, as Kueue's
AFS usage ledger does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from dateutil.parser import isoparse

from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError
from ..apiserver.matching import label_selector_matches, quantity
from . import cycle, finalizers, names, owners, status, sync, workloads
from .ledger import UsageLedger
from .options import KueueOptions
from .preemption import Admitted
from .scheduler import Entry, add, flavors_of, matching_flavors
from .webhook import Outage

log = logging.getLogger(__name__)
IDLE_SECONDS = 5.0
"""Longest sleep with no change and no timer running (usage samples are due every few minutes)."""
_KEYS = {("", "pods"), ("batch", "jobs"), ("", "namespaces"), names.WORKLOADS,
         (names.GROUP, "clusterqueues"), (names.GROUP, "localqueues"), (names.GROUP, "resourceflavors"),
         (names.GROUP, "workloadpriorityclasses")}


class KueueController:
    """State Kueue keeps in memory: the AFS usage ledger and the last queue order (for visibility)."""

    def __init__(self, options: KueueOptions, outage: Outage | None = None) -> None:
        self.options = options
        self.outage = outage or Outage()
        """While down, no pass runs (Kueue's process is gone); the first pass after catches up."""
        self.ledger = UsageLedger(options.usage_half_life, options.usage_sampling, dict(options.resource_weights))
        self.queue_order: dict[str, list[Entry]] = {}
        """ClusterQueue name -> pending Workloads, head first, as of the last pass."""
        self._timers = False

    def restart(self, options: KueueOptions) -> None:
        """Kueue's manager started again with ``options``: what it kept in memory (usage samples, the queue order)
        starts over; what is in the API (Workloads, queues) stays. On the server's loop, between two passes."""
        self.options = options
        self.ledger = UsageLedger(options.usage_half_life, options.usage_sampling, dict(options.resource_weights))
        self.queue_order.clear()  # the visibility routes hold this dict
        self._timers = False

    # ---- one pass ----------------------------------------------------------------------------------
    def managed_namespaces(self, api: Api) -> set[str]:
        items, _ = api.store.snapshots(("", "namespaces"))
        return {n["metadata"]["name"] for n in items
                if label_selector_matches(self.options.namespace_selector, n["metadata"].get("labels") or {})}

    def sweep(self, api: Api) -> float:
        """One pass; returns how long the loop may sleep without missing a timeout or a backoff's end."""
        self._timers = self.options.pods_ready_timeout is not None
        sync.ensure_workloads(api, self.managed_namespaces(api))
        finalizers.settle(api)
        sync.follow_priorities(api)
        wl_rt = api.kind(names.API_VERSION, "Workload")
        for wl in api.list(wl_rt)["items"]:
            if self._released_after_eviction(api, wl):
                continue  # finished (its owner gone) on the next pass, as Kueue writes the two in turn
            if sync.mark_finished(api, wl):
                continue
            if names.is_true(wl, names.FINISHED):
                continue
            self._lifecycle(api, wl)
        self._schedule(api, api.list(wl_rt)["items"])
        return self.options.tick if self._timers else min(self.options.usage_sampling, IDLE_SECONDS)

    def _released_after_eviction(self, api: Api, wl: dict[str, Any]) -> bool:
        """An evicted Workload whose owner stopped gives its quota back (as real Kueue, before its Workload is
        marked finished when the owner is gone: a plain pod's); True if it did now."""
        if not (names.is_true(wl, names.QUOTA_RESERVED) and names.is_true(wl, names.EVICTED)):
            return False
        if owners.active(api, wl):
            return False
        self._release(api, wl)
        return True

    def _lifecycle(self, api: Api, wl: dict[str, Any]) -> None:
        reserved = names.is_true(wl, names.QUOTA_RESERVED)
        if reserved and names.is_true(wl, names.EVICTED):
            return  # its owner is still stopping
        if reserved:
            self._pods_ready(api, wl)
            return
        if self.options.pods_ready_timeout is not None and names.find(wl, names.PODS_READY) is None:
            # as Kueue's workload controller with waitForPodsReady on: a Workload not admitted yet waits to start
            conditions = [dict(c) for c in (wl.get("status") or {}).get("conditions") or []]
            names.set_condition(conditions, names.condition(names.PODS_READY, False, "WaitForStart",
                                                            "Not all pods are ready or succeeded",
                                                            wl["metadata"].get("generation")))
            cycle.patch_status(api, wl, {"conditions": conditions})
        state = (wl.get("status") or {}).get("requeueState") or {}
        requeued = names.find(wl, names.REQUEUED)
        if not (requeued and requeued["status"] == "False" and state.get("requeueAt")):
            return
        self._timers = True  # a backoff is running
        if isoparse(state["requeueAt"]) <= datetime.now(timezone.utc):
            conditions = [dict(c) for c in wl["status"]["conditions"]]
            names.set_condition(conditions, names.condition(names.REQUEUED, True, "BackoffFinished",
                                                            "The workload backoff was finished"))
            cycle.patch_status(api, wl, {"conditions": conditions})

    def _release(self, api: Api, wl: dict[str, Any]) -> None:
        evicted = names.find(wl, names.EVICTED) or {}
        reason, message = str(evicted.get("reason", "")), str(evicted.get("message", ""))
        gen = wl["metadata"].get("generation")
        conditions = [dict(c) for c in wl["status"]["conditions"]]
        requeue: dict[str, Any] | None = None
        if reason == names.PODS_READY_TIMEOUT:
            count = int(((wl["status"].get("requeueState") or {}).get("count")) or 0) + 1
            delay = self.options.requeue_base_seconds * (2 ** (count - 1))
            at = (datetime.now(timezone.utc) + timedelta(seconds=delay)).strftime("%Y-%m-%dT%H:%M:%SZ")
            requeue = {"count": count, "requeueAt": at}
        # a single pod's Workload is not requeued after preemption: its pod is gone
        # (SkipReassignmentForPodOwnedWorkloads); a Job's and a backed-off Workload's are
        requeued_now = reason == "Preempted" and owners.job_of(api, wl) is not None
        names.set_condition(conditions, names.condition(names.REQUEUED, requeued_now, reason, message, gen))
        # reason Pending, as Kueue 0.19.2 writes it (its UnadmittedWorkloadsObservability gate off)
        names.set_condition(conditions, names.condition(names.QUOTA_RESERVED, False, "Pending", message, gen))
        names.set_condition(conditions, names.condition(names.ADMITTED, False, "NoReservation",
                                                        "The workload has no reservation", gen))
        patch: dict[str, Any] = {"conditions": conditions, "admission": None}
        if requeue is not None:
            patch["requeueState"] = requeue
        cycle.patch_status(api, wl, patch)

    def _pods_ready(self, api: Api, wl: dict[str, Any]) -> None:
        ready = owners.pods_ready(api, wl)
        old = names.find(wl, names.PODS_READY)
        if ready and not (old and old["status"] == "True"):
            conditions = [dict(c) for c in wl["status"]["conditions"]]
            names.set_condition(conditions, names.condition(names.PODS_READY, True, "Started",
                                "All pods reached readiness and the workload is running",
                                wl["metadata"].get("generation")))
            cycle.patch_status(api, wl, {"conditions": conditions})
            return
        if not ready and old and old["status"] == "True" and self.options.pods_ready_timeout is not None:
            # a started pod no longer ready (its node lost): Kueue waits for its recovery, with no timeout (its
            # recoveryTimeout is unset by default), and evicts nothing for it
            conditions = [dict(c) for c in wl["status"]["conditions"]]
            names.set_condition(conditions, names.condition(names.PODS_READY, False, "WaitForRecovery",
                                "At least one pod has failed, waiting for recovery", wl["metadata"].get("generation")))
            cycle.patch_status(api, wl, {"conditions": conditions})
            return
        timeout = self.options.pods_ready_timeout
        admitted = names.find(wl, names.ADMITTED)
        if ready or timeout is None or admitted is None or (old and old["reason"] != "WaitForStart"):
            return
        if isoparse(admitted["lastTransitionTime"]) + timedelta(seconds=timeout) <= datetime.now(timezone.utc):
            meta = wl["metadata"]
            cycle.evict(api, wl, names.PODS_READY_TIMEOUT,
                        f"Exceeded the PodsReady timeout {meta['namespace']}/{meta['name']}")

    def _schedule(self, api: Api, all_workloads: list[dict[str, Any]]) -> None:
        queues = {f"{q['metadata']['namespace']}/{q['metadata']['name']}": q
                  for q in api.list(api.kind(names.API_VERSION, "LocalQueue"))["items"]}
        views = {cq["metadata"]["name"]: cycle.QueueView(cq, *flavors_of(cq))
                 for cq in api.list(api.kind(names.API_VERSION, "ClusterQueue"))["items"]}
        node_labels = {f["metadata"]["name"]: dict((f.get("spec") or {}).get("nodeLabels") or {})
                       for f in api.list(api.kind(names.API_VERSION, "ResourceFlavor"))["items"]}
        admitted_usage: dict[str, dict[str, float]] = {}
        for wl in all_workloads:
            if names.is_true(wl, names.FINISHED) or not wl["spec"].get("active", True):
                continue
            meta = wl["metadata"]
            lq_key = f"{meta['namespace']}/{wl['spec'].get('queueName', '')}"
            lq = queues.get(lq_key)
            view = views.get((lq.get("spec") or {}).get("clusterQueue", "")) if lq else None
            if names.is_true(wl, names.QUOTA_RESERVED):
                adm = _admitted(wl)
                if view is not None and adm is not None:
                    view.admitted.append((adm, wl))
                    add(view.used, adm.flavor, adm.usage)
                    bucket = admitted_usage.setdefault(lq_key, {})
                    for r, v in adm.usage.items():
                        bucket[r] = bucket.get(r, 0.0) + float(v)
                continue
            requeued = names.find(wl, names.REQUEUED)
            if requeued is not None and requeued["status"] == "False":
                continue  # backing off, or a pod Workload that is not requeued
            blocker = _queue_blocker(api, wl, lq, view)
            if blocker or view is None:
                cycle.mark_pending(api, wl, blocker, names.INADMISSIBLE)
                continue
            queued_at = _queue_time(wl)
            group = {f.name: node_labels.get(f.name, {}) for f in view.flavors}
            fits = matching_flavors([ps.get("template") or {} for ps in wl["spec"]["podSets"]], group)
            view.pending.append((Entry(meta["namespace"], meta["name"], wl["spec"].get("queueName", ""),
                                       workloads.priority(wl), queued_at,
                                       workloads.requests(wl, self.options.exclude_resource_prefixes),
                                       meta["uid"], fits), wl))
        self.ledger.forget(queues)
        sampled = self.ledger.sample(admitted_usage, queues)
        weights = {key: _lq_weight(lq) for key, lq in queues.items()}

        def on_admit(entry: Entry, afs: bool) -> None:
            key = f"{entry.namespace}/{entry.queue}"
            bucket = admitted_usage.setdefault(key, {})
            for r, v in entry.requests.items():
                bucket[r] = bucket.get(r, 0.0) + float(v)
            if afs:  # Kueue charges entry penalties only in a ClusterQueue with Admission Fair Sharing
                self.ledger.admit(key, entry.requests, bucket)

        for name, view in views.items():
            afs = ((view.cluster_queue.get("spec") or {}).get("admissionScope") or {}).get(
                "admissionMode") == "UsageBasedAdmissionFairSharing"
            usage = functools.partial(self.ledger.usage, weights) if afs else None
            self.queue_order[name] = cycle.run(api, view, usage, functools.partial(on_admit, afs=afs))
        status.write(api, views, queues, {k: self.ledger.entries[k].consumed for k in sampled})


def _lq_weight(lq: dict[str, Any]) -> float:
    """A LocalQueue's ``spec.fairSharing.weight`` (default 1): its usage counts divided by it."""
    weight = ((lq.get("spec") or {}).get("fairSharing") or {}).get("weight")
    return 1.0 if weight is None else float(quantity(str(weight)))


def _queue_blocker(api: Api, wl: dict[str, Any], lq: dict[str, Any] | None, view: cycle.QueueView | None) -> str:
    """Why the Workload cannot queue at all (Kueue's getQueueBlocker and ValidateAdmissibility), or ""."""
    if lq is None:
        return f"LocalQueue {wl['spec'].get('queueName')} doesn't exist"
    if view is None:
        return f"ClusterQueue {(lq.get('spec') or {}).get('clusterQueue')} doesn't exist"
    # a ClusterQueue without namespaceSelector admits no namespace; {} admits every one
    selector = (view.cluster_queue.get("spec") or {}).get("namespaceSelector")
    ns = api.find(api.type("", "v1", "namespaces"), "", wl["metadata"]["namespace"])
    labels = (ns or {}).get("metadata", {}).get("labels") or {}
    if selector is None or not label_selector_matches(selector, labels):
        return "workload namespace doesn't match ClusterQueue selector"
    return ""


def _queue_time(wl: dict[str, Any]) -> str:
    """Where the Workload stands among its priority, as Kueue's ``GetQueueOrderTimestamp`` (requeuing timestamp
    ``Eviction``, its default): the eviction's time after a PodsReady timeout, else the creation time. A
    Workload preempted within its ClusterQueue thus goes back to its own place, ahead of equal priorities
    queued after it, not to the end of the line."""
    evicted = names.find(wl, names.EVICTED)
    if evicted and evicted["status"] == "True" and evicted["reason"] == names.PODS_READY_TIMEOUT:
        return str(evicted["lastTransitionTime"])
    return str(wl["metadata"]["creationTimestamp"])


def _admitted(wl: dict[str, Any]) -> Admitted | None:
    admission = (wl.get("status") or {}).get("admission")
    if not admission or not admission.get("podSetAssignments"):
        return None
    usage: dict[str, Decimal] = {}
    flavor = ""
    for psa in admission["podSetAssignments"]:
        for resource, value in (psa.get("resourceUsage") or {}).items():
            usage[resource] = usage.get(resource, Decimal(0)) + quantity(value)
        flavor = flavor or next(iter((psa.get("flavors") or {}).values()), "")
    cond = names.find(wl, names.QUOTA_RESERVED) or {}
    return Admitted(wl["metadata"]["namespace"], wl["metadata"]["name"], workloads.priority(wl), flavor, usage,
                    str(cond.get("lastTransitionTime", now())))


async def run(api: Api, controller: KueueController) -> None:
    """Sweep on every relevant change, every ``tick`` seconds while a timeout or backoff runs, else every
    few seconds (usage samples)."""
    sub = api.store.subscribe(None)
    try:
        while True:
            wait = controller.options.tick
            try:
                if not controller.outage.down:
                    wait = controller.sweep(api)
            except ApiError as exc:  # a write refused for another reason than a race: a bug, said loudly
                log.error("sandbox Kueue: a write was refused (%s); the next pass retries", exc)
            except Exception:  # as a reconciler's error: logged and retried, the controller keeps running
                log.exception("sandbox Kueue: a pass failed; the next pass retries")
            if await sub.next_of(_KEYS, wait) is not None:
                await asyncio.sleep(0)  # coalesce a burst of events into one pass
    finally:
        sub.close()
