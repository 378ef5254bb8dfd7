"""The scheduler controller: binds pending pods with ``scheduler.decide`` and reports the ones it cannot.

It reacts to every change of pods and nodes, and retries unschedulable pods every second as well (as
kube-scheduler's backoff queue flushes), so a pod waiting for GPUs is bound once a GPU pod finishes.
A bound pod gets a ``Scheduled`` event; an unschedulable one gets condition PodScheduled=False with
reason ``Unschedulable`` and a ``FailedScheduling`` event, written again only when the message changes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..apiserver import events
from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError
from ..apiserver.patching import MERGE
from .scheduler import decide

COMPONENT = "default-scheduler"
RETRY_SECONDS = 1.0


def _pending(pod: dict[str, Any]) -> bool:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    # a pod with scheduling gates waits outside the scheduling queue until they are all removed
    return (not spec.get("nodeName") and not meta.get("deletionTimestamp") and not spec.get("schedulingGates")
            and spec.get("schedulerName", COMPONENT) == COMPONENT
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending")


def _unschedulable_message(pod: dict[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message", ""))
    return None


def _report_gated(api: Api, pods: list[dict[str, Any]]) -> None:
    """A gated pod shows PodScheduled=False, reason SchedulingGated (kubectl's STATUS column). kube-apiserver
    writes it when it stores the pod; the sandbox's scheduler pass does, as its API has no pod strategy."""
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        if not (pod.get("spec") or {}).get("schedulingGates") or meta.get("deletionTimestamp") or any(
                c.get("reason") == "SchedulingGated" for c in status.get("conditions") or []):
            continue
        condition = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                     "message": "Scheduling is blocked due to non-empty scheduling gates",
                     "lastTransitionTime": now(), "lastProbeTime": None}
        with contextlib.suppress(ApiError):
            api.patch(api.type("", "v1", "pods"), meta["namespace"], meta["name"],
                      {"status": {"conditions": [condition]}}, MERGE, "status")


def schedule_pending(api: Api) -> int:
    """One scheduling pass over every pending pod; returns how many were bound."""
    pods_rt, nodes_rt = api.type("", "v1", "pods"), api.type("", "v1", "nodes")
    with api.store.lock:
        pods, _ = api.store.list(pods_rt.key)
        nodes, _ = api.store.list(nodes_rt.key)
    _report_gated(api, pods)
    bound = 0
    for pod in sorted((p for p in pods if _pending(p)), key=lambda p: p["metadata"]["creationTimestamp"]):
        meta = pod["metadata"]
        decision = decide(pod, nodes, pods)
        try:
            if decision.node is not None:
                api.bind(meta["namespace"], meta["name"], decision.node)
                pod["spec"]["nodeName"] = decision.node  # count its requests for the next pods of this pass
                bound += 1
                events.record(api, pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/"
                              f"{meta['name']} to {decision.node}", COMPONENT)
            elif _unschedulable_message(pod) != decision.message:
                condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": decision.message, "lastTransitionTime": now(),
                             "lastProbeTime": None}
                api.patch(pods_rt, meta["namespace"], meta["name"], {"status": {"conditions": [condition]}},
                          MERGE, "status")
                events.record(api, pod, "Warning", "FailedScheduling", decision.message, COMPONENT)
        except ApiError:
            continue  # deleted or bound meanwhile: the next pass sees the new state
    return bound


async def scheduler_controller(api: Api) -> None:
    """Run scheduling passes on pod and node changes and every second; never returns."""
    keys = {("", "pods"), ("", "nodes")}
    sub = api.store.subscribe(None)
    try:
        while True:
            with contextlib.suppress(ApiError):
                schedule_pending(api)
            await sub.next_of(keys, RETRY_SECONDS)
    finally:
        sub.close()
