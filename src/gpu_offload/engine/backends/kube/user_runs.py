"""The runs of one user as the cluster holds them: the runner pods labelled with the user in the user's
namespace, whichever kernel or command created them (the panel and the runs REST API list runs of dead
kernels from here, and stop them by deleting their pods)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ....liqo_peering import labels as L
from ....liqo_peering.inventory import pod_gpus
from ....liqo_peering.specs import runner_selector
from ....liqo_peering.timestamps import parse_time
from ....liqo_peering.untrusted_text import shown
from ..base import UserRun
from .config import user_name
from .pods import PodApi
from .sweep import OrphanSweep

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
            return shown(cond.get("message") or cond.get("reason") or "not scheduled yet")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return shown(waiting.get("reason") or "waiting")  # Liqo reflects it from the donor
    return ""


def run_from_pod(pod: Mapping[str, Any]) -> UserRun | None:
    """The run a runner pod stands for (pure); ``None`` for a pod without a run-id label."""
    meta = pod.get("metadata") or {}
    found = meta.get("labels") or {}
    run_id = found.get(L.RUN_ID)
    if not run_id:
        return None
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    return UserRun(
        run_id=str(run_id), backend="kubernetes", kernel=str(found.get(L.KERNEL, "?")), cluster=_pod_cluster(pod), gpus=pod_gpus(pod),
        state=_PHASES.get(phase, "scheduling"),
        detail=f"pod {meta.get('name')}" + (f": {_waiting_reason(pod)}" if phase == "Pending" else ""),
        started=_timestamp(meta.get("creationTimestamp")), cli=found.get(L.ORIGIN) == L.ORIGIN_CLI,
    )


class UserPods:
    """A user's runs in one namespace, read from and stopped through their runner pods (``base.UserRuns``)."""

    def __init__(self, pods: PodApi, user: str) -> None:
        self.pods = pods
        self.user = user

    @classmethod
    def configured(cls, env: Mapping[str, str]) -> UserPods | None:
        """The user's and namespace as a kernel of ``env`` would find them (``JUPYTERHUB_USER``, the namespace
        setting, else the kubeconfig context's), over a client of ``KUBECONFIG`` (or the pod's service account):
        for a process without a kernel backend (``registry.user_runs``). None when no namespace is known."""
        from ....liqo_peering.client import api_client_from_environment, kubeconfig_namespace
        from ....liqo_peering.settings import read_kernel

        namespace = read_kernel(env).namespace or kubeconfig_namespace(env.get("KUBECONFIG"))
        if not namespace:
            return None
        return cls(PodApi(api_client_from_environment(), namespace), user_name(env))

    @property
    def where(self) -> str:
        """For messages."""
        return f"runner pods in {self.pods.namespace}"

    def user_runs(self) -> list[UserRun]:
        """Records of the user's runner pods in the namespace."""
        found = (run_from_pod(p) for p in self.pods.list_pods(runner_selector(self.user)))
        return [r for r in found if r is not None]

    def cancel_run(self, run_id: str) -> list[str]:
        """Delete what run ``run_id`` of the user holds (Job, pods, Services, Secrets); the names removed."""
        return self.pods.delete_matching(runner_selector(self.user, run_id=run_id))

    def sweep(self, server: str, live_kernels: Callable[[], Mapping[str, int | None]]) -> list[str]:
        """Delete what the dead kernels of Jupyter server ``server`` left (``sweep.OrphanSweep``); the names
        removed. Nothing without a user: no pod is then known to be this user's."""
        if not self.user:
            return []
        return OrphanSweep(self.pods, self.user, server, live_kernels).sweep()
