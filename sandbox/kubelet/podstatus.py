"""Pod and container status as a kubelet reports them, built from the test kubelet's records (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..apiserver.defaults import now


@dataclass
class ContainerRecord:
    """What the kubelet knows of one container (mutable: the kubelet updates it as the process lives)."""

    name: str
    image: str
    state: dict[str, Any] = field(default_factory=lambda: waiting("ContainerCreating"))
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    container_id: str = ""
    probe_ready: bool = True
    """What the readiness probe last said (True for a container without one)."""
    probe_started: bool = True
    """Whether the startup probe passed (True for a container without one)."""

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def started(self) -> bool:
        return self.running and self.probe_started

    @property
    def ready(self) -> bool:
        return self.started and self.probe_ready

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    """A ``waiting`` container state."""
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    return {"waiting": state}


def running(started_at: str) -> dict[str, Any]:
    """A ``running`` container state."""
    return {"running": {"startedAt": started_at}}


def terminated(exit_code: int, reason: str, started_at: str, container_id: str, signal: int | None = None,
               message: str = "") -> dict[str, Any]:
    """A ``terminated`` container state, finished now."""
    state: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "startedAt": started_at,
                             "finishedAt": now(), "containerID": container_id}
    if signal:
        state["signal"] = signal
    if message:
        state["message"] = message
    return {"terminated": state}


def exit_reason(exit_code: int) -> str:
    """The reason a kubelet gives a container that exited on its own."""
    return "Completed" if exit_code == 0 else "Error"


def container_status(rec: ContainerRecord) -> dict[str, Any]:
    """One entry of ``status.containerStatuses``."""
    out: dict[str, Any] = {
        "name": rec.name, "image": rec.image, "imageID": f"sandbox://{rec.image}" if rec.container_id else "",
        "ready": rec.ready, "started": rec.started, "restartCount": rec.restart_count,
        "state": rec.state, "lastState": rec.last_state,
    }
    if rec.container_id:
        out["containerID"] = rec.container_id
    return out


def phase(records: Sequence[ContainerRecord], restart_policy: str) -> str:
    """The pod phase the kubelet derives from its containers."""
    if any(r.running for r in records):
        return "Running"
    codes = [r.exit_code for r in records]
    if records and all(c is not None for c in codes):
        if all(c == 0 for c in codes):
            return "Succeeded" if restart_policy != "Always" else "Running"
        return "Failed" if restart_policy == "Never" else "Running"
    # waiting: Pending until a container has run once, then Running while it restarts
    if any(r.restart_count or r.exit_code is not None for r in records):
        return "Running"
    return "Pending"


def conditions(pod_phase: str, records: Sequence[ContainerRecord], scheduled_at: str,
               initialized: bool = True) -> list[dict[str, Any]]:
    """The pod's conditions for ``pod_phase``."""
    stamp = now()
    ready = pod_phase == "Running" and all(r.ready for r in records)
    unready = ", ".join(r.name for r in records if not r.ready)

    def cond(type_: str, ok: bool, reason: str = "") -> dict[str, Any]:
        out = {"type": type_, "status": "True" if ok else "False", "lastTransitionTime": stamp,
               "lastProbeTime": None}
        if not ok and reason:
            out["reason"] = reason
            if reason == "ContainersNotReady":
                out["message"] = f"containers with unready status: [{unready}]"
        return out

    not_ready = "PodCompleted" if pod_phase in ("Succeeded", "Failed") else "ContainersNotReady"
    return [
        cond("PodReadyToStartContainers", True),
        cond("Initialized", initialized, "ContainersNotInitialized"),
        cond("Ready", ready, not_ready),
        cond("ContainersReady", ready, not_ready),
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at, "lastProbeTime": None},
    ]
