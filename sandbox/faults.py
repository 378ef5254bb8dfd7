"""Faults to inject into a running sandbox, from tests (``SandboxFaults``) or over HTTP (``/sandbox/faults``).

=================  ==============================================================================
fault              effect
=================  ==============================================================================
node-not-ready     peering lost: the node's kubelet stops answering (no status, logs, attach, exec); after
                   ``grace`` seconds (default 50, Kubernetes' node-monitor grace period) Node Ready=Unknown,
                   unreachable taints (NoSchedule, NoExecute), its donor's ForeignCluster in Error, its pods
                   not Ready; each pod is then evicted when its toleration runs out (DisruptionTarget, stays
                   Terminating): ``controllers/nodelifecycle.py``
node-ready         the node and its ForeignCluster are healthy again (taints removed)
oom-kill           a container's process is killed: terminated, reason OOMKilled, exit code 137
evict              the pod fails with reason Evicted (processes stopped with its grace period)
image-pull         an image can no longer be pulled: new containers go ErrImagePull/ImagePullBackOff
slow-pull          an image is pulled on each node before its first container there, taking ``seconds``
                   (``size`` bytes): ``Pulling`` and ``Pulled`` events in a kubelet's words
api-error          requests whose path matches a regex get an HTTP error (default 503), ``times`` times
api-latency        requests whose path matches a regex are delayed by ``seconds``
cut-logs           every open ``pods/log`` follow stream of a pod is dropped mid-way
=================  ==============================================================================

Over HTTP: ``POST /sandbox/faults`` with ``{"fault": "<name>", ...parameters}`` applies one; ``GET`` lists
the active ones; ``DELETE`` clears them all. Bad input is a 400 naming the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .apiserver.defaults import now
from .apiserver.errors import ApiError
from .apiserver.http_faults import FaultRule
from .apiserver.patching import MERGE
from .controllers.nodelifecycle import NODE_MONITOR_GRACE, NodeLifecycle

if TYPE_CHECKING:
    from .apiserver.api import Api
    from .kubelet.images import Images
    from .kubelet.kubelet import Kubelet

CONTROL_PATH = "/sandbox/faults"
UNREACHABLE = "node.kubernetes.io/unreachable"
EVICTED_MESSAGE = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 10Mi."


class FaultError(ValueError):
    """A fault that cannot be applied; the message names the fix."""


class SandboxFaults:
    """The faults of one sandbox: nodes, containers, images, API requests, log streams."""

    def __init__(self, api: Api, kubelet: Kubelet, images: Images) -> None:
        self.api = api
        self.kubelet = kubelet
        self.images = images
        self.rules: list[FaultRule] = []
        self.lost_nodes: set[str] = set()
        self.nodes = NodeLifecycle(api, self._set_node)
        self._loop: asyncio.AbstractEventLoop | None = None
        """The server's loop, where the node timers run (known once a node was lost)."""

    # ---- nodes ---------------------------------------------------------------------------------
    def _node(self, name: str) -> dict[str, Any]:
        node = self.api.find(self.api.type("", "v1", "nodes"), "", name)
        if node is None:
            raise FaultError(f"node {name!r} does not exist: pick one of `kubectl get nodes`")
        return node

    def _set_node(self, name: str, ready: bool) -> None:
        nodes = self.api.type("", "v1", "nodes")
        node = self._node(name)
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != UNREACHABLE]
        if not ready:
            taints += [{"key": UNREACHABLE, "effect": effect, "timeAdded": now()} for effect in ("NoSchedule", "NoExecute")]
        self.api.patch(nodes, "", name, {"spec": {"taints": taints or None}}, MERGE)
        condition = ({"type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "kubelet is posting ready status (sandbox)"} if ready else
                     {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                      "message": "Kubelet stopped posting node status."})
        condition.update(lastHeartbeatTime=now(), lastTransitionTime=now())
        self.api.patch(nodes, "", name, {"status": {"conditions": [condition]}}, MERGE, "status")
        cluster = (node["metadata"].get("labels") or {}).get("liqo.io/remote-cluster-id")
        if cluster:
            self._set_foreign_cluster(cluster, ready)

    def _set_foreign_cluster(self, cluster: str, ready: bool) -> None:
        rt = self.api.kind("core.liqo.io/v1beta1", "ForeignCluster")
        fc = self.api.find(rt, "", cluster)
        if fc is None:
            return
        modules = (fc.get("status") or {}).get("modules") or {}
        wanted = {"NetworkConnectionStatus": "Established" if ready else "Error",
                  "OffloadingNodeStatus": "Ready" if ready else "NotReady"}
        for module in modules.values():
            for cond in module.get("conditions") or []:
                if cond.get("type") in wanted:
                    cond.update(status=wanted[cond["type"]], lastTransitionTime=now())
        with contextlib.suppress(ApiError):
            self.api.patch(rt, "", cluster, {"status": {"modules": modules}}, MERGE, "status")

    async def node_not_ready(self, name: str, grace: float = NODE_MONITOR_GRACE) -> int:
        """Peering lost: the node stops answering now, and goes NotReady ``grace`` seconds later, after which
        its pods are evicted as their tolerations say. Returns how many pods it holds."""
        self._node(name)
        if grace < 0:
            raise FaultError(f"grace={grace}: give 0 seconds or more (a real cluster waits 50)")
        self._loop = asyncio.get_running_loop()
        self.lost_nodes.add(name)
        return len(self.nodes.lose(name, grace))

    def node_ready(self, name: str) -> None:
        """The node (and its peering) is healthy again: its kubelet finishes what happened meanwhile. Callable
        from a test's thread: the work is done on the server's loop, which owns the timers and the kubelet."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is not None and running is not self._loop:
            asyncio.run_coroutine_threadsafe(self._node_back(name), self._loop).result(30)
            return
        self.nodes.restore(name)
        if name in self.lost_nodes:
            self.lost_nodes.discard(name)
            self.kubelet.node_back(name)

    async def _node_back(self, name: str) -> None:
        self.node_ready(name)

    # ---- pods ----------------------------------------------------------------------------------
    def _worker(self, namespace: str, pod: str) -> Any:
        worker = self.kubelet.worker(namespace, pod)
        if worker is None:
            raise FaultError(f"pod {namespace}/{pod} is not running on the sandbox kubelet: wait until it is "
                             "Running (kubectl get pod) and name it exactly")
        return worker

    async def oom_kill(self, namespace: str, pod: str, container: str = "") -> None:
        """Kill a container as the kernel's OOM killer would (reason OOMKilled, exit code 137)."""
        worker = self._worker(namespace, pod)
        name = container or worker.records[0].name
        if not await worker.kill_container(name, "OOMKilled"):
            raise FaultError(f"container {name!r} of pod {namespace}/{pod} is not running: "
                             "wait until it runs, or name a running container")

    async def evict(self, namespace: str, pod: str, message: str = EVICTED_MESSAGE) -> None:
        """Evict a pod: it fails with reason Evicted."""
        worker = self._worker(namespace, pod)
        worker.event("Warning", "Evicted", message)
        await worker.fail("Evicted", message, grace=float(worker.pod["spec"].get("terminationGracePeriodSeconds", 30)))

    def cut_logs(self, namespace: str, pod: str) -> int:
        """Drop every open log follow stream of the pod; returns how many container logs were affected."""
        return self.api.logs.cut(namespace, pod)

    # ---- images and requests -------------------------------------------------------------------
    def image_unavailable(self, image: str) -> None:
        """Make ``image`` fail to pull from now on."""
        self.images.missing.add(image)

    def slow_pull(self, image: str, seconds: float, size: int = 0) -> None:
        """Have ``image`` pulled on each node before its first container there, taking ``seconds``."""
        self.images.slow_pull(image, seconds, size)

    def api_error(self, path: str, status: int = 503, methods: tuple[str, ...] = (), times: int = 0,
                  message: str = "") -> FaultRule:
        """Answer requests matching ``path`` (a regex) with HTTP ``status`` (and ``message``, to stand in for an
        admission plugin or policy the sandbox does not run)."""
        return self._rule(FaultRule(path, tuple(methods), status=status, times=times, message=message))

    def api_latency(self, path: str, seconds: float, methods: tuple[str, ...] = (), times: int = 0) -> FaultRule:
        """Delay requests matching ``path`` (a regex) by ``seconds``."""
        return self._rule(FaultRule(path, tuple(methods), delay=seconds, times=times))

    def api_hold(self, path: str, methods: tuple[str, ...] = (), times: int = 1, longest: float = 60.0) -> FaultRule:
        """Hold requests matching ``path`` until :meth:`release` (at most ``longest`` seconds each)."""
        return self._rule(FaultRule(path, tuple(methods), delay=longest, times=times, hold=True))

    def release(self, rule: FaultRule) -> None:
        """Serve what ``rule`` holds."""
        self.api.faults.release(rule)

    def _rule(self, rule: FaultRule) -> FaultRule:
        if re.search(rule.path, CONTROL_PATH):
            raise FaultError(f"path pattern {rule.path!r} would also block {CONTROL_PATH}: anchor it to the API "
                             "paths, e.g. ^/api/v1/namespaces/[^/]+/pods")
        self.rules.append(self.api.faults.add(rule))
        return rule

    def active(self) -> dict[str, Any]:
        """What is injected right now: an API rule removed from the server (``api.faults.remove``) is not, one that
        ran out of its ``times`` still is, with how often it fired."""
        rules = [r for r in self.rules if self.api.faults.installed(r)]
        return {"lostNodes": sorted(self.lost_nodes), "missingImages": sorted(self.images.missing),
                "slowPulls": sorted(self.images.pull_times),
                "apiRules": [{"path": r.path, "methods": list(r.methods), "status": r.status, "delay": r.delay,
                              "times": r.times, "fired": self.api.faults.fired(r)} for r in rules]}

    def clear(self) -> None:
        """Undo every fault that can be undone (failed pods stay failed)."""
        for rule in self.rules:
            self.api.faults.remove(rule)
        self.rules.clear()
        self.images.missing.clear()
        self.images.pull_times.clear()
        for name in list(self.lost_nodes):
            with contextlib.suppress(FaultError, ApiError):
                self.node_ready(name)
        self.lost_nodes.clear()

    # ---- HTTP control endpoint -----------------------------------------------------------------
    async def apply(self, body: dict[str, Any]) -> Any:
        """Apply the fault described by ``body`` (see the module docstring)."""
        def need(key: str) -> Any:
            if key not in body:
                raise FaultError(f"fault {body.get('fault')!r} needs {key!r}; see GET {CONTROL_PATH}")
            return body[key]

        fault = body.get("fault")
        ns = body.get("namespace", "default")
        handlers: dict[str, Any] = {
            "node-not-ready": lambda: self.node_not_ready(need("node"), float(body.get("grace", NODE_MONITOR_GRACE))),
            "node-ready": lambda: self.node_ready(need("node")),
            "oom-kill": lambda: self.oom_kill(ns, need("pod"), body.get("container", "")),
            "evict": lambda: self.evict(ns, need("pod")),
            "cut-logs": lambda: self.cut_logs(ns, need("pod")),
            "image-pull": lambda: self.image_unavailable(need("image")),
            "slow-pull": lambda: self.slow_pull(need("image"), float(need("seconds")), int(body.get("size", 0))),
            "api-error": lambda: self.api_error(need("path"), int(body.get("status", 503)),
                                                tuple(body.get("methods", ())), int(body.get("times", 0))),
            "api-latency": lambda: self.api_latency(need("path"), float(need("seconds")),
                                                    tuple(body.get("methods", ())), int(body.get("times", 0))),
        }
        if fault not in handlers:
            raise FaultError(f"unknown fault {fault!r}: use one of {', '.join(sorted(handlers))}")
        result = handlers[fault]()
        if hasattr(result, "__await__"):
            result = await result
        return result if isinstance(result, (int, str, type(None))) else str(result)

    def routes(self, app: web.Application) -> None:
        """Add ``GET/POST/DELETE /sandbox/faults`` to the server's app."""
        async def get(_: web.Request) -> web.Response:
            return web.json_response({**self.active(), "faults": _names()})

        async def post(request: web.Request) -> web.Response:
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise FaultError('send a JSON object like {"fault": "node-not-ready", "node": "donor-1-gpu"}')
                result = await self.apply(body)
            except (json.JSONDecodeError, FaultError, ValueError, TypeError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response({"applied": body["fault"], "result": result})

        async def delete(_: web.Request) -> web.Response:
            self.clear()
            return web.json_response({"cleared": True})

        app.router.add_get(CONTROL_PATH, get)
        app.router.add_post(CONTROL_PATH, post)
        app.router.add_delete(CONTROL_PATH, delete)


def _names() -> list[str]:
    return ["node-not-ready", "node-ready", "oom-kill", "evict", "image-pull", "slow-pull", "api-error", "api-latency",
            "cut-logs"]
