"""One bound pod on the test kubelet: prepare its containers, run them, restart them, stop them.

Life of a pod here, as on a kubelet:

1. ``ContainerCreating`` until its image resolves (else ``ErrImagePull``, then ``ImagePullBackOff``,
   retried), its Secret/ConfigMap volumes exist (``FailedMount`` events, retried) and its env resolves
   (else ``CreateContainerConfigError``, retried);
2. every container runs as a local process; its output goes to ``pods/log``; a container whose resident
   memory exceeds ``limits.memory`` is killed as ``OOMKilled`` (exit code 137), as its cgroup would be;
3. an exiting container, or one that cannot start (``StartError``, exit code 128: e.g. its command is not on
   PATH), is restarted per ``restartPolicy``: at once the first time, then after a back-off doubling from
   the kubelet config's base to its ceiling (a kubelet's 10 s to 300 s), forgotten once a run lasted twice
   the ceiling (a kubelet's 10 minutes) (``CrashLoopBackOff``);
   readiness and liveness probes (``probes.py``) set the container's ``ready`` or kill it for a restart;
4. ``activeDeadlineSeconds`` (from ``status.startTime``) stops all containers: phase Failed, reason
   ``DeadlineExceeded``; faults may end a pod the same way (``Evicted``, ``NodeLost``) or kill one
   container as ``OOMKilled``;
5. a graceful delete sends SIGTERM, SIGKILL after the grace period, then removes the pod.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..apiserver import incluster
from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.matching import quantity
from . import podnames, podstatus, probes
from .config import KubeletConfig, NameView
from .images import ImageError, Images, Runtime
from .isolation import Isolation, User, container_user, hand_over, reveal_plan
from .launch import Launch, StartError, build_launch
from .podfiles import (
    ConfigError,
    Lookup,
    MountError,
    PodContext,
    container_env,
    materialize_volumes,
    mount_volumes,
    volume_binds,
)
from .podstatus import ContainerRecord
from .process import ContainerProcess, Exit

COMPONENT = "kubelet"


def default_tag(image: str) -> str:
    """``busybox`` -> ``busybox:latest``: the name a kubelet pulls and says (``applyDefaultImageTag``)."""
    if "@" in image or ":" in image.rsplit("/", 1)[-1]:
        return image
    return f"{image}:latest"


def go_quoted(text: str) -> str:
    """Go's ``%q`` of an image name (printable ASCII: only ``"`` and ``\\`` are escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def go_duration(seconds: float) -> str:
    """``time.Duration.Truncate(time.Millisecond).String()``: ``850ms``, ``1.234s``, ``2m3.5s``, ``1h0m0s``."""
    ms = int(seconds * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


class Kubelet(Protocol):
    """What a pod worker needs of the kubelet that runs it (``kubelet.Kubelet``): its API, setup and images,
    the Secrets and ConfigMaps a pod sees, and where the worker reports its status and Events."""

    api: Api
    config: KubeletConfig
    state_dir: Path
    images: Images
    names: NameView | None
    in_cluster: incluster.InClusterApi | None
    isolating: bool
    process_owner: str

    def write_status(self, worker: PodWorker) -> None: ...

    def record(self, obj: Mapping[str, Any], type_: str, reason: str, message: str,
               field_path: str = "") -> None: ...

    def lookup(self, namespace: str, pod: Mapping[str, Any] | None = None) -> Lookup: ...

    def say_once(self, message: str) -> None: ...

    def name_table(self) -> list[podnames.Entry]: ...


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
        self.isolations: dict[str, Isolation] = {}
        self.netns: str | None = None
        """The pod's network namespace (``/run/netns/...``), None when it shares the host's."""
        self.listeners: list[Callable[[str, str, bytes], None]] = []
        self.kill_reasons: dict[str, str] = {}
        self.last_warning: dict[str, tuple[str, str]] = {}
        self.failure: tuple[str, str] | None = None
        self.device_env: dict[str, str] = {}
        """What the device plugin's Allocate answer puts in the containers (``devices``); it wins over the spec."""
        self.stopping = False
        self.start_time = now()
        self.started_monotonic = time.monotonic()
        self.task: asyncio.Task[None] | None = None
        self.pulled: set[str] = set()
        """Containers whose image this worker pulled (they get no "already present" event)."""

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

    async def _pull(self, rec: ContainerRecord) -> None:
        """Pull the container's image when it is not on this node yet (the ``slow-pull`` fault): the events a
        kubelet's image manager writes, in its words (``pkg/kubelet/images/image_manager.go``)."""
        pull = self.kubelet.images.pull_needed(self.node, rec.image)
        if pull is None:
            return
        seconds, size = pull
        quoted = go_quoted(default_tag(rec.image))
        self.event("Normal", "Pulling", f"Pulling image {quoted}", rec.name)
        started = time.monotonic()
        await asyncio.sleep(seconds)
        self.kubelet.images.pulled(self.node, rec.image)
        took = go_duration(time.monotonic() - started)
        self.event("Normal", "Pulled", f"Successfully pulled image {quoted} in {took} ({took} including waiting). "
                                       f"Image size: {size} bytes.", rec.name)
        self.pulled.add(rec.name)

    async def _prepare(self, spec: dict[str, Any], rec: ContainerRecord) -> Launch:
        delay = self.kubelet.config.backoff
        while True:
            try:
                await self._pull(rec)
                runtime = await asyncio.to_thread(self.kubelet.images.resolve, rec.image)
                volumes = materialize_volumes(self.pod, self.dir, self.kubelet.lookup(self.namespace, self.pod))
                paths = mount_volumes(spec, volumes, self.dir / "rootfs")
                env = container_env(self.pod, spec, self._context(), self.kubelet.lookup(self.namespace, self.pod))
                api_access = self._api_access()
                if self.kubelet.in_cluster is not None:  # the spec's own variables win, as on a kubelet
                    env = {**self.kubelet.in_cluster.environment(), **env}
                if self.device_env and _asks_devices(spec):
                    env = {**env, **self.device_env}
                launch = build_launch(self.pod, spec, runtime, env, paths)
                if self.kubelet.isolating:
                    binds = volume_binds(spec, volumes)
                    if api_access is not None:
                        binds = (*binds, (str(api_access), incluster.TOKEN_DIR))
                    self.isolations[rec.name] = self._isolation(spec, runtime, launch, binds)
                return launch
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

    def _api_access(self) -> Path | None:
        """The service account volume's folder (token, CA, namespace), when the pod gets one."""
        endpoint = self.kubelet.in_cluster
        if endpoint is None:
            return None
        account = self.pod["spec"].get("serviceAccountName") or "default"
        found = self.kubelet.lookup(self.namespace)("serviceaccounts", account)
        if not incluster.automounts(self.pod, found):
            return None
        return endpoint.write_token_files(self.dir / "volumes" / incluster.VOLUME, self.namespace, account)

    def _isolation(self, spec: dict[str, Any], runtime: Runtime, launch: Launch,
                   mounts: tuple[tuple[str, str], ...]) -> Isolation:
        user = container_user(self.pod, spec, runtime.image)
        hand_over(self.dir / "rootfs", user)
        hand_over(self.dir / "volumes", user)
        needed = [(Path(launch.argv[0]), True), (launch.cwd, False)]
        if Path(launch.argv[0]).is_relative_to(runtime.bin_dir):  # the image's shims run its interpreter
            needed.append((runtime.python, True))
        for program in {Path(launch.argv[0]), runtime.python}:
            interpreter = _shebang(program)
            if interpreter is not None:  # the kernel runs a script through the interpreter its #! names
                needed.append((interpreter, True))
        try:
            reveal = reveal_plan(needed, user)
        except PermissionError as exc:
            fix = "let that user read it (chmod o+r, or o+x for a program), or run the container as its owner"
            if user.explicit:
                raise StartError(f"{exc}: {fix}") from exc
            self.kubelet.say_once(f"{runtime.image} runs as root, not its default user: {exc}; {fix}")
            user, reveal = User(0, 0), ()
        # the other pods' folders (their Secrets) are hidden from this pod's containers, whoever they run as
        reveal = (*reveal, (str(self.dir.parent), (str(self.dir),)))
        return Isolation(user, self.netns, self._name_files(), podnames.hostname(self.pod), reveal, mounts)

    def _name_files(self) -> tuple[tuple[str, str], ...]:
        # a pod in its own network namespace resolves cluster names from files (see podnames.py)
        if self.netns is None:
            return ()
        self.write_names(self.kubelet.name_table())
        resolv = self.dir / "resolv.conf"
        resolv.write_text(podnames.resolv_conf(self._names_namespace()[0]))
        return ((str(self.dir / "hosts"), "/etc/hosts"), (str(resolv), "/etc/resolv.conf"))

    def _names_namespace(self) -> tuple[str, dict[str, str] | None]:
        # a pod offloaded to a donor runs there in its namespace's twin, and sees that cluster's names
        twins = self.kubelet.names(self.pod) if self.kubelet.names else None
        return (twins or {}).get(self.namespace, self.namespace), twins

    def write_names(self, table: list[podnames.Entry]) -> None:
        """Rewrite the pod's hosts file in place (the containers see it through their bind mount)."""
        if self.netns is None or not self.dir.is_dir():  # a finished pod's folder is gone: no container reads it
            return
        namespace, twins = self._names_namespace()
        if twins is not None:
            table = podnames.renamed(table, twins)
        text = podnames.hosts_file(self.pod, self.pod_ip, table, namespace)
        path = self.dir / "hosts"
        if not path.exists() or path.read_text() != text:
            with open(path, "r+" if path.exists() else "w") as hosts:  # same inode: the mount follows it
                hosts.write(text)
                hosts.truncate()

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
        if rec.name not in self.pulled:  # a kubelet says one or the other
            self.event("Normal", "Pulled", f'Container image "{rec.image}" already present on machine', rec.name)
        self.event("Normal", "Created", f"Created container {rec.name}", rec.name)
        try:
            proc = await ContainerProcess.start(launch.argv, dict(launch.env), launch.cwd, self._sink(rec.name),
                                                stdin=stdin, isolation=self.isolations.get(rec.name),
                                                owner=self.kubelet.process_owner)
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
        delay: float | None = None  # None: the next restart is at once, as a kubelet's first one is
        while True:
            if self.stopping or self.failure is not None:
                return False
            began = time.monotonic()
            result = await self._run_once(spec, rec)
            self.kubelet.api.logs.close(self.namespace, self.name, rec.name)
            if self.stopping or self.failure is not None or not self._restarts(result.code, init):
                self.publish()
                return result.code == 0
            if time.monotonic() - began > 2 * self.kubelet.config.max_backoff:
                delay = None  # ran long enough (a kubelet: 10 minutes): the back-off is forgotten
            rec.last_state, rec.restart_count = rec.state, rec.restart_count + 1
            if delay is None:
                delay = self.kubelet.config.backoff
                self.publish()
                continue
            rec.state = podstatus.waiting("CrashLoopBackOff", f"back-off {delay:g}s restarting failed "
                                          f"container={rec.name} pod={self.name}_{self.namespace}({self.uid})")
            self.event("Warning", "BackOff", f"Back-off restarting failed container {rec.name} in pod "
                                             f"{self.name}_{self.namespace}({self.uid})", rec.name)
            self.publish()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.kubelet.config.max_backoff)

    async def _run_once(self, spec: dict[str, Any], rec: ContainerRecord) -> Exit:
        """Prepare and run the container once; exit code 128 if it could not start (StartError)."""
        try:
            launch = await self._prepare(spec, rec)
        except StartError as exc:
            rec.state = podstatus.terminated(128, "StartError", now(), f"sandbox://{uuid.uuid4().hex}",
                                             message=str(exc))
            self.event("Warning", "Failed", f"Error: {exc}", rec.name)
            return Exit(128)
        self.launches[rec.name] = launch
        started = now()
        # a (re)started container is unready until probed, and not started until its startup probe passed
        rec.probe_ready, rec.probe_started = not spec.get("readinessProbe"), not spec.get("startupProbe")
        proc = await self._start(rec, launch, bool(spec.get("stdin")))
        if proc is None:
            return Exit(128)
        limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
        watchers = [asyncio.ensure_future(self._memory_watch(rec.name, proc, int(quantity(limit))))] if limit else []
        watchers += self._probers(spec, rec, proc)
        try:
            result = await proc.wait()
        finally:  # also when the pod's task is cancelled: no probe outlives its container
            for watcher in watchers:
                watcher.cancel()
        reason = self.kill_reasons.pop(rec.name, podstatus.exit_reason(result.code))
        rec.state = podstatus.terminated(result.code, reason, started, rec.container_id, result.signal)
        return result

    def _probers(self, spec: dict[str, Any], rec: ContainerRecord, proc: ContainerProcess) -> list[asyncio.Task[None]]:
        if not any(spec.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")):
            return []

        def set_flag(flag: str) -> Callable[[bool], None]:
            def set_(ok: bool) -> None:
                setattr(rec, flag, ok)
                self.publish()
            return set_

        async def kill(kind: str) -> None:
            self.event("Normal", "Killing", f"Container {rec.name} failed {kind} probe, will be restarted", rec.name)
            await proc.stop(self._grace())

        async def run(command: list[str], timeout: float) -> tuple[int, str]:
            return await self.exec_in(rec.name, command, timeout)

        hooks = probes.Hooks(run, lambda t, r, m: self.event(t, r, m, rec.name), set_flag("probe_started"),
                             set_flag("probe_ready"), kill)
        return [asyncio.ensure_future(probes.supervise(spec, self.pod_ip, hooks))]

    async def exec_in(self, container: str, command: list[str], timeout: float) -> tuple[int, str]:
        """Run ``command`` in ``container``'s environment (an exec probe): its exit code and output; killed
        after ``timeout`` seconds."""
        launch = self.launches[container]
        argv = [launch.paths.rewrite(a) for a in command]
        output: list[bytes] = []
        proc = await ContainerProcess.start(argv, dict(launch.env), launch.cwd,
                                            lambda stream, data: output.append(data),
                                            owner=self.kubelet.process_owner)
        self.execs.add(proc)
        try:
            code = (await asyncio.wait_for(asyncio.shield(proc.wait()), timeout)).code
            return code, b"".join(output).decode(errors="replace")
        finally:
            if proc.exit is None:  # timed out, or the probe ended with its container: the shielded wait reaps it
                proc.signal_group(9)
            self.execs.discard(proc)

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


def _asks_devices(container: dict[str, Any]) -> bool:
    res = container.get("resources") or {}
    return any(str(k).startswith("nvidia.com/") for k in {**(res.get("requests") or {}), **(res.get("limits") or {})})


def _shebang(program: Path) -> Path | None:
    """The interpreter a script's ``#!`` line names, None for anything else."""
    try:
        with open(program, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return Path(words[0]) if words else None
