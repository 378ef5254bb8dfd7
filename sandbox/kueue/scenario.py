"""Fairness scenarios on a sandbox origin, in logical time, for tests and benchmarks of who gets the pool.

Every pod holds its GPU until it is released, and ``StepPool.release_oldest`` releases the one that started
first: what happens when cells all take the same time, without depending on how fast this machine runs
them. One release is one *step*; a pod started at step s and released at step r held a GPU for r - s
steps. ``held`` sums that per user over a period and ``jain`` gives Jain's fairness index of the split.
The same driver runs with Kueue (pods labelled with a queue, gated until admitted) and without it (the
caller creates a pod only where there is room, as the project's placement does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes
from kubernetes.stream import stream

from ..fixtures import wait_until

HOLD = "import sys; sys.stdin.readline()"
"""The container's program: it holds its GPU until a line arrives on its stdin."""
SCENARIO_LABEL = "gpu-offload.io/scenario"


def held_pod(name: str, user: str, queue: str | None = None, gpus: int = 1) -> dict[str, Any]:
    """A one-container pod that asks for ``gpus`` GPUs and runs until released (``queue``: Kueue's label)."""
    labels = {SCENARIO_LABEL: user}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "python:3.12", "command": ["python3", "-c", HOLD],
                "stdin": True, "stdinOnce": True,
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


LIQO_TOLERATION = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}
QUEUE = "user-queue"


def user_namespaces(client: Any, users: Iterable[str]) -> None:
    """A namespace per user, offloaded through Liqo (``NamespaceOffloading``) as the project's kernels do."""
    core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
    for user in users:
        core.create_namespace({"metadata": {"name": user}})
        custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", user, "namespaceoffloadings", {
            "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}})


def kueue_pool(client: Any, users: Iterable[str], donors: Mapping[str, int], **cluster_queue_spec: Any) -> None:
    """A flavor per donor (its virtual node, Liqo's toleration), one ClusterQueue ``gpus`` over them with
    ``cluster_queue_spec`` (e.g. ``admissionScope``), a LocalQueue ``user-queue`` in each user's namespace."""
    custom = kubernetes.client.CustomObjectsApi(client)
    group, version = "kueue.x-k8s.io", "v1beta2"

    def create(plural: str, body: dict[str, Any], namespace: str = "") -> None:
        body = {"apiVersion": f"{group}/{version}", **body}
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(group, version, plural, body)
    for donor in donors:
        create("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": donor}, "spec": {
            "nodeLabels": {"liqo.io/remote-cluster-id": donor}, "tolerations": [LIQO_TOLERATION]}})
    create("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": "gpus"}, "spec": {
        "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": d, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": n}]} for d, n in donors.items()]}],
        **cluster_queue_spec}})
    for user in users:
        create("localqueues", {"kind": "LocalQueue", "metadata": {"name": QUEUE}, "spec": {"clusterQueue": "gpus"}},
               user)


def workload_count(client: Any, users: Iterable[str]) -> int:
    """How many Workloads Kueue made in the users' namespaces."""
    custom = kubernetes.client.CustomObjectsApi(client)
    return sum(len(custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", u, "workloads")["items"])
               for u in users)


@dataclass
class Hold:
    """One pod's time on the pool, in steps."""

    user: str
    namespace: str
    name: str
    started: int
    ended: int | None = None


def held(holds: Iterable[Hold], start: int, end: int) -> dict[str, int]:
    """GPU-steps per user within [start, end) (a pod still running counts up to ``end``)."""
    out: dict[str, int] = {}
    for h in holds:
        stop = end if h.ended is None else min(h.ended, end)
        out[h.user] = out.get(h.user, 0) + max(0, stop - max(h.started, start))
    return out


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one takes everything."""
    xs = list(values)
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return 1.0 if squares == 0 else total * total / (len(xs) * squares)


@dataclass
class StepPool:
    """Pods of a scenario on a pool of ``size`` GPUs, followed step by step."""

    core: kubernetes.client.CoreV1Api
    size: int
    step: int = 0
    holds: list[Hold] = field(default_factory=list)
    timeout: float = 120.0

    def _pods(self) -> list[Any]:
        return list(self.core.list_pod_for_all_namespaces(label_selector=SCENARIO_LABEL).items)

    def settle(self, extra: Callable[[], bool] = lambda: True) -> list[Hold]:
        """Wait until the pool is full or nothing waits (and ``extra()``); record the pods that started
        since, at the current step, and return them."""
        def done() -> list[Any] | None:
            pods = self._pods()
            running = [p for p in pods if p.status.phase == "Running"]
            waiting = [p for p in pods if p.status.phase == "Pending"]
            full = sum(_gpus(p) for p in running) >= self.size
            return pods if (full or not waiting) and not any(_starting(p) for p in waiting) and extra() else None
        pods = wait_until(done, f"the pool settled at step {self.step}", timeout=self.timeout)
        known = {(h.namespace, h.name) for h in self.holds}
        new = [Hold(p.metadata.labels[SCENARIO_LABEL], p.metadata.namespace, p.metadata.name, self.step)
               for p in sorted((p for p in pods if p.status.phase == "Running"), key=_start_key)
               if (p.metadata.namespace, p.metadata.name) not in known]
        self.holds.extend(new)
        return new

    def release_oldest(self) -> Hold:
        """End the longest-running pod (a line on its stdin), wait for it to finish; one step passes."""
        hold = next(h for h in self.holds if h.ended is None)
        attach = stream(self.core.connect_get_namespaced_pod_attach, hold.name, hold.namespace, container="main",
                        stdin=True, stdout=False, stderr=False, tty=False, _preload_content=False)
        try:
            attach.write_stdin("done\n")
        finally:
            attach.close()
        wait_until(lambda: self.core.read_namespaced_pod(hold.name, hold.namespace).status.phase == "Succeeded",
                   f"pod {hold.namespace}/{hold.name} finished", timeout=self.timeout)
        self.step += 1
        hold.ended = self.step
        return hold

    def running(self) -> list[Hold]:
        return [h for h in self.holds if h.ended is None]

    def by_user(self) -> Mapping[str, list[Hold]]:
        out: dict[str, list[Hold]] = {}
        for h in self.holds:
            out.setdefault(h.user, []).append(h)
        return out


def _gpus(pod: Any) -> int:
    return sum(int((c.resources.limits or {}).get("nvidia.com/gpu", 0)) for c in pod.spec.containers)


def _starting(pod: Any) -> bool:
    """Bound or ungated but not running yet: the pool is about to change."""
    return bool(pod.spec.node_name) or (not pod.spec.scheduling_gates and pod.status.phase == "Pending"
                                        and not _unschedulable(pod))


def _unschedulable(pod: Any) -> bool:
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])


def _start_key(pod: Any) -> tuple[Any, str]:
    statuses = pod.status.container_statuses or []
    started = statuses[0].state.running.started_at if statuses and statuses[0].state.running else None
    return (started, pod.metadata.name)
