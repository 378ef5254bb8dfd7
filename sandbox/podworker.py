"""One bound pod on the test kubelet: prepare its containers, run them, restart them, stop them.

Life of a pod here, as on a kubelet:

1. ``ContainerCreating`` until its image resolves (else ``ErrImagePull``, then ``ImagePullBackOff``,
   retried), its Secret/ConfigMap volumes exist (``FailedMount`` events, retried) and its env resolves
   (else ``CreateContainerConfigError``, retried);
2. every container runs as a local process; its output goes to ``pods/log``; a container whose resident
   memory exceeds ``limits.memory`` is killed as ``OOMKilled`` (exit code 137), as its cgroup would be;
3. an exiting container is restarted per ``restartPolicy`` with a growing back-off (``CrashLoopBackOff``);
4. ``activeDeadlineSeconds`` (from ``status.startTime``) stops all containers: phase Failed, reason
   ``DeadlineExceeded``; faults may end a pod the same way (``Evicted``, ``NodeLost``) or kill one
   container as ``OOMKilled``;
5. a graceful delete sends SIGTERM, SIGKILL after the grace period, then removes the pod.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import podstatus
from .defaults import now
from .images import ImageError
from .launch import Launch, StartError, build_launch
from .matching import quantity
from .podfiles import ConfigError, MountError, PodContext, container_env, materialize_volumes, mount_volumes
from .podstatus import ContainerRecord
from .process import ContainerProcess, Exit

if TYPE_CHECKING:
    from .kubelet import Kubelet

COMPONENT = "kubelet"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


class PodWorker:
    """Runs one pod's containers and reports their status."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any], pod_ip: str, host_ip: str) -> None:
        meta = pod["metadata"]
        self.kubelet = kubelet
        self.pod = pod
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.node = pod["spec"]["nodeName"]
        self.pod_ip, self.host_ip = pod_ip, host_ip
        self.dir = kubelet.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.init_records = [ContainerRecord(c["name"], c.get("image", ""))
                             for c in pod["spec"].get("initContainers") or []]
        self.records = [ContainerRecord(c["name"], c.get("image", "")) for c in pod["spec"]["containers"]]
        if self.init_records:
            for rec in self.records:
                rec.state = podstatus.waiting("PodInitializing")
        self.initialized = not self.init_records
        self.processes: dict[str, ContainerProcess] = {}
        self.execs: set[ContainerProcess] = set()
        self.launches: dict[str, Launch] = {}
        self.listeners: list[Callable[[str, str, bytes], None]] = []
        self.kill_reasons: dict[str, str] = {}
        self.last_warning: dict[str, tuple[str, str]] = {}
        self.failure: tuple[str, str] | None = None
        self.stopping = False
        self.start_time = now()
        self.started_monotonic = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    # ---- status -------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The status this worker reports (merged into the pod's by a merge patch)."""
        restart = self.pod["spec"].get("restartPolicy", "Always")
        init_failed = any(r.exit_code for r in self.init_records) and restart == "Never"
        if self.failure or init_failed:
            phase = "Failed"
        else:
            phase = podstatus.phase(self.records, restart) if self.initialized else "Pending"
        scheduled = next((c.get("lastTransitionTime") for c in (self.pod.get("status") or {}).get("conditions")
                          or [] if c.get("type") == "PodScheduled"), self.start_time)
        out = {
            "phase": phase,
            "reason": self.failure[0] if self.failure else None,
            "message": self.failure[1] if self.failure else None,
            "hostIP": self.host_ip, "hostIPs": [{"ip": self.host_ip}],
            "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": podstatus.conditions(phase, self.records, scheduled or self.start_time,
                                               self.initialized),
            "containerStatuses": [podstatus.container_status(r) for r in self.records],
        }
        if self.init_records:
            out["initContainerStatuses"] = [podstatus.container_status(r) for r in self.init_records]
        return out

    def publish(self) -> None:
        """Write the current status to the API (a pod already gone is fine)."""
        self.kubelet.write_status(self)

    def event(self, type_: str, reason: str, message: str, container: str = "") -> None:
        """Record an Event about this pod from the kubelet."""
        field_path = f"spec.containers{{{container}}}" if container else ""
        self.kubelet.record(self.pod, type_, reason, message, field_path)

    # ---- preparation --------------------------------------------------------------------------
    def _context(self) -> PodContext:
        meta = self.pod["metadata"]
        return PodContext(self.namespace, self.name, self.uid, self.node,
                          self.pod["spec"].get("serviceAccountName", "default"), self.pod_ip, self.host_ip,
                          meta.get("labels") or {}, meta.get("annotations") or {})

    async def _prepare(self, spec: dict[str, Any], rec: ContainerRecord) -> Launch:
        delay = self.kubelet.config.backoff
        while True:
            try:
                runtime = await asyncio.to_thread(self.kubelet.images.resolve, rec.image)
                volumes = materialize_volumes(self.pod, self.dir, self.kubelet.lookup(self.namespace))
                paths = mount_volumes(spec, volumes, self.dir / "rootfs")
                env = container_env(self.pod, spec, self._context(), self.kubelet.lookup(self.namespace))
                return build_launch(self.pod, spec, runtime, env, paths)
            except ImageError as exc:
                pulled_once = rec.state.get("waiting", {}).get("reason") == "ErrImagePull"
                self._wait_state(rec, "ImagePullBackOff" if pulled_once else "ErrImagePull", str(exc),
                                 "BackOff" if pulled_once else "Failed")
            except MountError as exc:
                self._wait_state(rec, "ContainerCreating", "", "FailedMount", str(exc))
            except ConfigError as exc:
                self._wait_state(rec, "CreateContainerConfigError", str(exc), "Failed")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.kubelet.config.max_backoff)

    def _wait_state(self, rec: ContainerRecord, reason: str, message: str, event_reason: str,
                    event_message: str = "") -> None:
        state = podstatus.waiting(reason, message)
        said = (event_reason, event_message or message)
        if said != self.last_warning.get(rec.name):
            self.last_warning[rec.name] = said
            self.event("Warning", event_reason, said[1], rec.name)
        if state != rec.state:
            rec.state = state
            self.publish()

    # ---- running ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Prepare and run every container until the pod ends or is stopped."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.publish()
        deadline = self.pod["spec"].get("activeDeadlineSeconds")
        watchdog = asyncio.ensure_future(self._deadline(int(deadline))) if deadline else None
        try:
            for spec, rec in zip(self.pod["spec"].get("initContainers") or [], self.init_records, strict=True):
                if not await self._container_loop(spec, rec, init=True):
                    self.publish()
                    return
            self.initialized = True
            await asyncio.gather(*(self._container_loop(spec, rec)
                                   for spec, rec in zip(self.pod["spec"]["containers"], self.records, strict=True)))
        finally:
            if watchdog is not None:
                watchdog.cancel()

    def _sink(self, container: str) -> Callable[[str, bytes], None]:
        def sink(stream: str, data: bytes) -> None:
            self.kubelet.api.logs.write(self.namespace, self.name, container, data)
            for listener in list(self.listeners):
                listener(container, stream, data)
        return sink

    async def _start(self, rec: ContainerRecord, launch: Launch, stdin: bool) -> ContainerProcess | None:
        # the events a kubelet writes before a container runs (KubeSpawner shows them as spawn progress)
        self.event("Normal", "Pulled", f'Container image "{rec.image}" already present on machine', rec.name)
        self.event("Normal", "Created", f"Created container {rec.name}", rec.name)
        try:
            proc = await ContainerProcess.start(launch.argv, dict(launch.env), launch.cwd, self._sink(rec.name),
                                                stdin=stdin)
        except OSError as exc:
            rec.state = podstatus.terminated(128, "StartError", now(), f"sandbox://{uuid.uuid4().hex}",
                                             message=str(exc))
            self.event("Warning", "Failed", f"Error: failed to start container: {exc}", rec.name)
            return None
        rec.container_id = f"sandbox://{proc.pid}"
        rec.state = podstatus.running(now())
        self.processes[rec.name] = proc
        self.event("Normal", "Started", f"Started container {rec.name}", rec.name)
        self.publish()
        return proc

    async def _container_loop(self, spec: dict[str, Any], rec: ContainerRecord, init: bool = False) -> bool:
        """Run one container, restarting it per the pod's policy; True if it ended successfully."""
        try:
            launch = await self._prepare(spec, rec)
        except StartError as exc:
            rec.state = podstatus.terminated(128, "StartError", now(), "", message=str(exc))
            self.event("Warning", "Failed", f"Error: {exc}", rec.name)
            self.publish()
            return False
        self.launches[rec.name] = launch
        delay = self.kubelet.config.backoff
        while True:
            if self.stopping or self.failure is not None:
                return False
            started = now()
            proc = await self._start(rec, launch, bool(spec.get("stdin")))
            limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
            watch = asyncio.ensure_future(self._memory_watch(rec.name, proc, int(quantity(limit)))) \
                if proc and limit else None
            result = await proc.wait() if proc else Exit(128)
            if watch is not None:
                watch.cancel()
            self.kubelet.api.logs.close(self.namespace, self.name, rec.name)
            if proc is not None:
                reason = self.kill_reasons.pop(rec.name, podstatus.exit_reason(result.code))
                rec.state = podstatus.terminated(result.code, reason, started, rec.container_id, result.signal)
            if self.stopping or self.failure is not None or not self._restarts(result.code, init):
                self.publish()
                return result.code == 0
            rec.last_state, rec.restart_count = rec.state, rec.restart_count + 1
            rec.state = podstatus.waiting("CrashLoopBackOff", f"back-off {delay:g}s restarting failed "
                                          f"container={rec.name} pod={self.name}_{self.namespace}({self.uid})")
            self.event("Warning", "BackOff", "Back-off restarting failed container", rec.name)
            self.publish()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.kubelet.config.max_backoff)

    async def _memory_watch(self, container: str, proc: ContainerProcess, limit: int) -> None:
        # the cgroup limit a kubelet would set, checked on the main process's RSS every 0.1 s
        while proc.exit is None:
            if proc.rss_bytes() > limit:
                self.event("Warning", "OOMKilling", f"Memory cgroup out of memory: killed process {proc.pid} "
                                                    f"of container {container} (limit {limit} bytes)", container)
                await self.kill_container(container, "OOMKilled")
                return
            await asyncio.sleep(0.1)

    def _restarts(self, code: int, init: bool) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if init:  # an init container is re-run only after a failure, and never under Never
            return code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    async def _deadline(self, seconds: int) -> None:
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - self.started_monotonic)))
        self.event("Normal", "DeadlineExceeded", DEADLINE_MESSAGE)
        await self.fail("DeadlineExceeded", DEADLINE_MESSAGE, grace=self._grace())

    # ---- stopping -----------------------------------------------------------------------------
    def _grace(self) -> float:
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    async def stop_containers(self, grace: float) -> None:
        """Stop every running process: SIGTERM, then SIGKILL after ``grace`` seconds."""
        await asyncio.gather(*(p.stop(grace) for p in [*self.processes.values(), *self.execs]))

    async def fail(self, reason: str, message: str, grace: float) -> None:
        """End the pod as Failed with ``reason`` (DeadlineExceeded, Evicted, NodeLost...)."""
        if self.failure is not None:
            return
        self.failure = (reason, message)
        await self.stop_containers(grace)
        if self.task is not None:
            await asyncio.wait([self.task], timeout=grace + 5)
        self.publish()

    async def kill_container(self, container: str, reason: str) -> bool:
        """SIGKILL one container's process and report ``reason`` (e.g. OOMKilled); False if not running."""
        proc = self.processes.get(container)
        if proc is None or proc.exit is not None:
            return False
        self.kill_reasons[container] = reason
        proc.signal_group(9)
        await proc.wait()
        return True

    async def terminate(self, grace: float) -> None:
        """A graceful delete: stop the containers, report, then let the pod go."""
        self.stopping = True
        await self.stop_containers(grace)
        if self.task is not None:
            await asyncio.wait([self.task], timeout=5)
        self.publish()
