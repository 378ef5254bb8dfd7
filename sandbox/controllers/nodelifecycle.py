"""Kubernetes' node lifecycle and taint eviction, for a node that stopped answering (the sandbox's
``node-not-ready`` fault: a donor's peering or virtual kubelet lost).

As kube-controller-manager 1.35 does it: ``grace`` seconds after the node's kubelet went silent (its
``--node-monitor-grace-period``, 50 s) the node's Ready condition goes Unknown, it gets the unreachable taints
(NoSchedule, NoExecute) and each of its pods' Ready condition goes False with a ``NodeNotReady`` event. The taint
eviction controller then deletes each pod once its toleration of the NoExecute taint runs out, first setting
the pod condition ``DisruptionTarget`` (reason ``DeletionByTaintManager``): at once without a matching toleration,
never when every matching toleration has no ``tolerationSeconds``. Nobody on the node can confirm the deletion,
so the pod stays Running and Terminating until the node answers again or someone force-deletes it. Until then
the kubelet neither reports nor acts for the node, and the API server cannot reach it for logs, attach or exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..apiserver import events
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError
from ..apiserver.patching import MERGE
from ..apiserver.tolerations import UNREACHABLE, tolerates

if TYPE_CHECKING:
    from ..apiserver.api import Api

NODE_MONITOR_GRACE = 50.0
"""kube-controller-manager's default ``--node-monitor-grace-period`` (seconds)."""
COMPONENT = "node-controller"


def eviction_delay(tolerations: Iterable[Mapping[str, Any]], taint: str = UNREACHABLE) -> float | None:
    """Seconds until the taint eviction controller deletes a pod with ``tolerations`` from a node tainted
    ``taint`` (NoExecute): 0 without a matching toleration, None (never) when no match gives seconds."""
    matching = [t for t in tolerations if tolerates(t, taint)]
    if not matching:
        return 0.0
    seconds = [float(t["tolerationSeconds"]) for t in matching if t.get("tolerationSeconds") is not None]
    return max(0.0, min(seconds)) if seconds else None


class NodeLifecycle:
    """The node controller's and taint eviction's timers for the nodes lost right now."""

    def __init__(self, api: Api, mark_node: Callable[[str, bool], None]) -> None:
        self.api = api
        self._mark_node = mark_node
        """``mark_node(name, ready)``: write the node's Ready condition and taints (and its peering's state)."""
        self._pods = api.type("", "v1", "pods")
        self._timers: dict[str, list[asyncio.Task[None]]] = {}

    def lose(self, name: str, grace: float) -> list[dict[str, Any]]:
        """The node's kubelet stops answering now; returns its pods. Call on the server's loop."""
        self.api.unreachable_nodes.add(name)
        pods = self._pods_on(name)
        for pod in pods:  # open log streams were served through the kubelet: they drop
            self.api.logs.cut(pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._timers.setdefault(name, []).append(asyncio.ensure_future(self._unknown_after(name, grace)))
        return pods

    def restore(self, name: str) -> None:
        """The node answers again (its kubelet takes over what happened meanwhile)."""
        for task in self._timers.pop(name, []):
            task.cancel()
        self.api.unreachable_nodes.discard(name)
        self._mark_node(name, True)

    def _pods_on(self, name: str) -> list[dict[str, Any]]:
        items, _ = self.api.store.list(self._pods.key)
        return [p for p in items if (p.get("spec") or {}).get("nodeName") == name
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    async def _unknown_after(self, name: str, grace: float) -> None:
        await asyncio.sleep(grace)
        self._mark_node(name, False)
        for pod in self._pods_on(name):
            self._not_ready(pod)
            delay = eviction_delay((pod.get("spec") or {}).get("tolerations") or [])
            if delay is not None:
                self._timers[name].append(asyncio.ensure_future(self._evict_after(pod, delay)))

    def _not_ready(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        conditions = [dict(c, status="False", lastTransitionTime=now()) if c.get("type") == "Ready" else c
                      for c in (pod.get("status") or {}).get("conditions") or []]
        with contextlib.suppress(ApiError):
            self.api.patch(self._pods, meta["namespace"], meta["name"], {"status": {"conditions": conditions}},
                           MERGE, "status")
            events.record(self.api, pod, "Warning", "NodeNotReady", "Node is not ready", COMPONENT)

    async def _evict_after(self, pod: dict[str, Any], delay: float) -> None:
        await asyncio.sleep(math.ceil(delay))  # the controller schedules whole seconds
        meta = pod["metadata"]
        current = self.api.find(self._pods, meta["namespace"], meta["name"])
        if current is None or current["metadata"]["uid"] != meta["uid"] or current["metadata"].get("deletionTimestamp"):
            return
        kept = [c for c in (current.get("status") or {}).get("conditions") or [] if c.get("type") != "DisruptionTarget"]
        target = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                  "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": now()}
        with contextlib.suppress(ApiError):
            self.api.patch(self._pods, meta["namespace"], meta["name"], {"status": {"conditions": [*kept, target]}},
                           MERGE, "status")
            self.api.delete(self._pods, meta["namespace"], meta["name"], grace_period=None)
