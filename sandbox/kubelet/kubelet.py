"""The test kubelet: runs the containers of every pod bound to a sandbox node as local processes.

One kubelet serves all nodes of the sandbox (local and virtual). It watches pods; a pod bound to a node
gets a :class:`~gpu_offload.sandbox.kubelet.podworker.PodWorker`, an IP and (as root) a network namespace of its
own (``podnet.py``), and a folder ``<state>/pods/<ns>_<name>_<uid8>/``. It serves ``pods/attach`` (the container's stdin and live output)
and ``pods/exec`` (a new process in the container's environment). A graceful delete is finished by the
kubelet once the processes ended. ``shutdown()`` stops every process; none outlives the sandbox.

A *gate* (Liqo's virtual kubelet, see ``liqo_controllers.py``) may hold a pod back with a status of its
own (OffloadingBackOff) instead of running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import shutil
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..apiserver import events
from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError
from ..apiserver.incluster import InClusterApi
from ..apiserver.patching import MERGE
from ..apiserver.streams import StreamIO, StreamRequest
from . import devices, endpointslices, podnames
from .config import KubeletConfig, NameView
from .images import Images
from .isolation import can_isolate
from .launch import Launch
from .poddns import PodResolvers
from .podfiles import Lookup
from .podnet import PodNetwork
from .podworker import COMPONENT, PodWorker
from .process import ContainerProcess
from .serviceproxy import ServiceProxy, backends

LOG = logging.getLogger(__name__)
Gate = Callable[[dict[str, Any]], "dict[str, Any] | None"]
"""``gate(pod)`` -> a status to report instead of running the pod, or None to run it."""


KUBELET_CONDITIONS = {"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"}
"""Pod conditions the kubelet writes; others (TerminationTarget from Kueue, DisruptionTarget, readiness
gates) are kept, as the kubelet's generateAPIPodStatus does."""


class Kubelet:
    """Pod workers for every bound pod, plus the attach/exec provider."""

    def __init__(self, api: Api, images: Images, config: KubeletConfig, gate: Gate | None = None,
                 names: NameView | None = None,
                 donor_lookup: Callable[[Mapping[str, Any]], Lookup | None] | None = None) -> None:
        self.api = api
        self.donor_lookup = donor_lookup
        """For a pod on a virtual node, its donor's copies of Secrets and ConfigMaps (what Liqo reflected
        there); None: the origin's objects."""
        self.names = names
        self.images = images
        self.config = config
        self.state_dir = config.state_dir
        self.gate = gate
        self.devices = devices.DeviceManager()
        """The GPU devices each pod holds, as the kubelet's device manager and NVIDIA's plugin hand them out."""
        self.workers: dict[tuple[str, str], PodWorker] = {}
        self.gated: set[str] = set()
        self.process_owner = f"kubelet-{uuid.uuid4().hex}"
        """The tag of every process this kubelet starts (``process.live_processes``)."""
        self.isolating = config.isolate and can_isolate()
        if config.isolate and not self.isolating:
            LOG.warning("sandbox: not root, so containers run as this user (%s) whatever their runAsUser, in "
                        "the host's process table", getpass.getuser())
        self.network = PodNetwork.for_this_machine(self.isolating)
        self.resolvers = PodResolvers()
        self._said: set[str] = set()
        self._services = api.type("", "v1", "services")
        self._names_pending = False
        self.proxy = ServiceProxy(self.network.add_address) if self.network.isolated else None
        self._proxy_sync: asyncio.Task[None] | None = None
        self._proxy_dirty = False
        self._pods = api.type("", "v1", "pods")
        self._task: asyncio.Task[None] | None = None
        self._names_task: asyncio.Task[None] | None = None
        self._deleting: set[asyncio.Future[None]] = set()
        self.in_cluster: InClusterApi | None = None
        """The API's endpoint for pods; None: containers get no in-cluster configuration (``incluster.py``)."""

    # ---- plumbing for workers ------------------------------------------------------------------
    def say_once(self, message: str) -> None:
        """A warning in the sandbox's log, the first time only."""
        if message not in self._said:
            self._said.add(message)
            LOG.warning("sandbox: %s", message)

    def lookup(self, namespace: str, pod: Mapping[str, Any] | None = None) -> Lookup:
        """Secrets and ConfigMaps of ``namespace`` by name, as the node ``pod`` runs on has them: on a
        virtual node, the copies Liqo reflected to its donor."""
        donor = self.donor_lookup(pod) if pod is not None and self.donor_lookup is not None else None

        def find(kind: str, name: str) -> dict[str, Any] | None:
            if donor is not None and kind in ("secrets", "configmaps"):
                return donor(kind, name)
            return self.api.find(self.api.type("", "v1", kind), namespace, name)
        return find

    def record(self, obj: Mapping[str, Any], type_: str, reason: str, message: str, field_path: str = "") -> None:
        """An Event from the kubelet of the object's node."""
        host = (obj.get("spec") or {}).get("nodeName", "")
        events.record(self.api, dict(obj, kind="Pod"), type_, reason, message, COMPONENT, host, field_path)

    def write_status(self, worker: PodWorker) -> None:
        """Merge the worker's status into its pod (nothing if the pod is gone or was replaced, or while its node
        does not answer: the API server hears nothing from it)."""
        if worker.node in self.api.unreachable_nodes:
            return
        self._patch_status(worker.namespace, worker.name, worker.uid, worker.status())

    def _patch_status(self, namespace: str, name: str, uid: str, status: dict[str, Any]) -> None:
        with self.api.store.lock:
            current = self.api.find(self._pods, namespace, name)
            if current is None or current["metadata"]["uid"] != uid:
                return
            if "conditions" in status:  # as the kubelet's status manager, keep conditions others own
                kept = [c for c in (current.get("status") or {}).get("conditions") or []
                        if c.get("type") not in KUBELET_CONDITIONS]
                status = {**status, "conditions": list(status["conditions"]) + kept}
            with contextlib.suppress(ApiError):
                self.api.patch(self._pods, namespace, name, {"status": status}, MERGE, "status")

    def host_ip(self, node_name: str) -> str:
        """The node's InternalIP (127.0.0.1 if it has none)."""
        node = self.api.find(self.api.type("", "v1", "nodes"), "", node_name) or {}
        addresses = (node.get("status") or {}).get("addresses") or []
        return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "127.0.0.1")

    # ---- the watch loop ------------------------------------------------------------------------
    def start(self) -> None:
        """Take over the pods: existing bound ones now, later ones as they are bound. Call on the loop."""
        self.api.pod_termination = self._will_terminate
        items, rv = self.api.store.list(self._pods.key)
        for pod in items:
            self._on_pod(pod)
        sub = self.api.store.subscribe(self._pods.key, since=rv)
        self.api.streams.register(self.stream)
        self.api.streams.register_port_forward(self.connect)
        self._task = asyncio.ensure_future(self._watch(sub))
        services = self.api.store.subscribe(self._services.key, since=self.api.store.list(self._services.key)[1])
        self._names_task = asyncio.ensure_future(self._watch_services(services))

    async def _watch_services(self, sub: Any) -> None:
        async for _event in sub:
            self._names_changed()

    def name_table(self) -> list[podnames.Entry]:
        """Every Service and pod name of the cluster with its address (see ``podnames.py``)."""
        return podnames.entries(self.api.store.list(self._services.key)[0], self.api.store.list(self._pods.key)[0])

    async def _sync_proxy(self) -> None:
        while self.proxy is not None and self._proxy_dirty:  # one sync at a time, the last state wins
            self._proxy_dirty = False
            await self.proxy.sync(backends(self.api.store.list(self._services.key)[0],
                                           self.api.store.list(self._pods.key)[0]))

    def _names_changed(self) -> None:
        # coalesced: a burst of pod updates rewrites the slices and the pods' hosts files once
        if not self._names_pending:
            self._names_pending = True
            asyncio.get_running_loop().call_later(0.05, self._write_names)

    def _write_names(self) -> None:
        self._names_pending = False
        endpointslices.sync(self.api)
        if not self.network.isolated:
            return
        table = self.name_table()
        for worker in list(self.workers.values()):
            worker.write_names(table)
        self._proxy_dirty = True
        if self._proxy_sync is None or self._proxy_sync.done():
            self._proxy_sync = asyncio.ensure_future(self._sync_proxy())

    async def _watch(self, sub: Any) -> None:
        async for event in sub:
            self._names_changed()
            if event.type == "DELETED":
                self._on_deleted(event.object)
            else:
                self._on_pod(event.object)

    def _will_terminate(self, pod: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        # a node that does not answer cannot confirm the end either: the pod stays Terminating until it does
        return (meta["namespace"], meta["name"]) in self.workers or self._unreachable(pod)

    def _unreachable(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("nodeName") in self.api.unreachable_nodes

    def node_back(self, node: str) -> None:
        """The node answers again: its kubelet reports its pods and finishes the deletions it missed, and starts
        the pods bound to it meanwhile."""
        items, _ = self.api.store.list(self._pods.key)
        for pod in items:
            if (pod.get("spec") or {}).get("nodeName") != node:
                continue
            meta = pod["metadata"]
            worker = self.workers.get((meta["namespace"], meta["name"]))
            if meta.get("deletionTimestamp") and (worker is None or worker.uid != meta["uid"]):
                with contextlib.suppress(ApiError):  # nothing of it ran here: it goes at once
                    self.api.delete(self._pods, meta["namespace"], meta["name"], grace_period=0,
                                    preconditions={"uid": meta["uid"]})
                continue
            if worker is not None and worker.uid == meta["uid"]:
                self.write_status(worker)
            self._on_pod(pod)

    def _on_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        worker = self.workers.get(key)
        if worker is not None and worker.uid != meta["uid"]:
            self._forget(key)
            worker = None
        if self._unreachable(pod):  # nobody on that node hears of it until it answers again (node_back)
            return
        if worker is not None:
            if meta.get("deletionTimestamp") and not worker.stopping:
                grace = float(meta.get("deletionGracePeriodSeconds", 0))
                task = asyncio.ensure_future(self._finish_delete(worker, grace))
                self._deleting.add(task)
                task.add_done_callback(self._deleting.discard)
            return
        if not (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        self._admit(pod)

    def _admit(self, pod: dict[str, Any]) -> None:
        held = self.gate(pod) if self.gate else None
        if held is not None:
            if pod["metadata"]["uid"] not in self.gated:
                self.gated.add(pod["metadata"]["uid"])
                self._patch_status(pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"], held)
                self.record(pod, "Warning", str(held.get("reason", "Held")), str(held.get("message", "")))
            return
        meta = pod["metadata"]
        node = self.api.find(self.api.type("", "v1", "nodes"), "", pod["spec"]["nodeName"]) or {}
        device_env, refusal = self.devices.allocate(pod, node, self._holding())
        if refusal is not None:  # the device manager refuses the pod at admission: it fails, nothing runs
            self._patch_status(meta["namespace"], meta["name"], meta["uid"], {
                "phase": "Failed", "reason": devices.REASON, "message": refusal, "startTime": now()})
            self.record(pod, "Warning", devices.REASON, refusal)
            return
        host_ip = self.host_ip(pod["spec"]["nodeName"])
        # a hostNetwork pod shares the node's network and reports the node's address, as on a node
        pod_ip, netns = (host_ip, None) if pod["spec"].get("hostNetwork") else self.network.attach(meta["uid"])
        worker = PodWorker(self, dict(pod), pod_ip, host_ip)
        worker.device_env = device_env
        worker.netns = netns
        if netns is not None:
            try:
                self.resolvers.open(meta["uid"], netns)
            except OSError as exc:  # names still resolve from the hosts file; others fail slower
                self.say_once(f"sandbox: no nameserver in pod network namespaces ({exc}): a name the hosts file "
                              "lacks says 'try again' instead of 'no such name'")
        self.workers[(meta["namespace"], meta["name"])] = worker
        worker.task = asyncio.ensure_future(self._run(worker))

    def _holding(self) -> set[str]:
        """Uids of the pods still holding their devices: the device manager frees those of ended pods."""
        return {w.uid for w in self.workers.values() if w.status()["phase"] not in ("Succeeded", "Failed")}

    async def _run(self, worker: PodWorker) -> None:
        try:
            await worker.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not take the whole kubelet down: report it on the pod
            worker.failure = ("KubeletError", f"sandbox kubelet failed on this pod: {exc!r}")
            worker.publish()

    async def _finish_delete(self, worker: PodWorker, grace: float) -> None:
        await worker.terminate(grace)
        with contextlib.suppress(ApiError):
            self.api.delete(self._pods, worker.namespace, worker.name, grace_period=0,
                            preconditions={"uid": worker.uid})

    def _on_deleted(self, pod: dict[str, Any]) -> None:
        self.gated.discard(pod["metadata"]["uid"])
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        worker = self.workers.get(key)
        if worker is not None and worker.uid == pod["metadata"]["uid"]:
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        worker = self.workers.pop(key)
        worker.stopping = True
        for proc in [*worker.processes.values(), *worker.execs]:
            proc.signal_group(9)
        if worker.task is not None:
            worker.task.cancel()
        self.resolvers.close(worker.uid)
        self.network.detach(worker.uid)
        shutil.rmtree(worker.dir, ignore_errors=True)

    async def shutdown(self) -> None:
        """Stop watching and kill every container process (no grace: the sandbox is going away)."""
        for running in (self._task, self._names_task, self._proxy_sync):
            if running is not None:
                running.cancel()
        for task in list(self._deleting):
            task.cancel()
        workers = list(self.workers.values())
        for key in list(self.workers):
            self._forget(key)
        procs = [p for w in workers for p in [*w.processes.values(), *w.execs]]
        await asyncio.gather(*(p.stop(0) for p in procs), return_exceptions=True)
        await asyncio.gather(*(w.task for w in workers if w.task), return_exceptions=True)
        if self.proxy is not None:
            self.proxy.close()
        self.resolvers.close_all()
        self.network.close()

    # ---- attach, exec and port-forward ---------------------------------------------------------
    async def connect(self, namespace: str, pod: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to ``port`` of a running pod, at the pod's IP (``pods/portforward``)."""
        worker = self.workers.get((namespace, pod))
        if worker is None or not any(r.running for r in worker.records):
            raise ApiError(400, "BadRequest", f"pod {namespace}/{pod} has no running container: wait until it "
                                              "is Running")
        return await asyncio.open_connection(worker.pod_ip, port)

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        """The worker running a pod, if any."""
        return self.workers.get((namespace, name))

    async def stream(self, req: StreamRequest, io: StreamIO) -> int:
        """The attach/exec provider for every node."""
        worker = self.workers.get((req.namespace, req.pod))
        container = req.container or (worker.records[0].name if worker else "")
        launch = worker.launches.get(container) if worker else None
        proc = worker.processes.get(container) if worker else None
        if worker is None or launch is None or proc is None or proc.exit is not None:
            raise ApiError(400, "BadRequest", f"container {container} is not running in pod "
                                              f"{req.namespace}/{req.pod}: wait until it is Running")
        if req.kind == "exec":
            return await self._exec(req, io, launch, worker, container)
        return await self._attach(req, io, worker, container, proc)

    async def _exec(self, req: StreamRequest, io: StreamIO, launch: Launch, worker: PodWorker,
                    container: str) -> int:
        writes: list[asyncio.Task[None]] = []

        def sink(stream: str, data: bytes) -> None:
            write = io.write_stdout if stream == "stdout" else io.write_stderr
            writes.append(asyncio.ensure_future(write(data)))

        argv = [launch.paths.rewrite(a) for a in req.command]
        try:
            proc = await ContainerProcess.start(argv, dict(launch.env), launch.cwd, sink, stdin=req.stdin,
                                                isolation=worker.isolations.get(container),
                                                join=worker.processes.get(container),
                                                owner=self.process_owner)
        except OSError as exc:
            raise ApiError(500, "InternalError", f'exec: "{req.command[0] if req.command else ""}": {exc}') from exc
        worker.execs.add(proc)  # it lives in the container: it ends with it
        feeder = asyncio.ensure_future(self._feed(io, proc)) if req.stdin else None
        exit_ = await proc.wait()
        worker.execs.discard(proc)
        if feeder is not None:
            feeder.cancel()
        await asyncio.gather(*writes, return_exceptions=True)  # all output before the exit status
        return exit_.code

    @staticmethod
    async def _feed(io: StreamIO, proc: ContainerProcess) -> None:
        while (data := await io.read_stdin()) is not None:
            await proc.write_stdin(data)
        proc.close_stdin()

    async def _attach(self, req: StreamRequest, io: StreamIO, worker: PodWorker, container: str,
                      proc: ContainerProcess) -> int:
        spec = next(c for c in worker.pod["spec"]["containers"] if c["name"] == container)
        if req.stdin and not spec.get("stdin"):
            raise ApiError(400, "BadRequest", f"Unable to use stdin - container {container} did not allocate "
                                              "one: set stdin: true in the container spec")
        writes: list[asyncio.Task[None]] = []

        def listener(name: str, stream: str, data: bytes) -> None:
            if name == container:
                write = io.write_stdout if stream == "stdout" else io.write_stderr
                writes.append(asyncio.ensure_future(write(data)))

        worker.listeners.append(listener)
        try:
            if req.stdin:
                while (data := await io.read_stdin()) is not None:
                    await proc.write_stdin(data)
                if spec.get("stdinOnce"):
                    proc.close_stdin()
            exit_ = await proc.wait()
            await asyncio.gather(*writes, return_exceptions=True)
            return exit_.code
        finally:
            worker.listeners.remove(listener)
