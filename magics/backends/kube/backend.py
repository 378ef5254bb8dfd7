"""The kubernetes backend: place the cell, make sure the namespace is offloaded, create Pod and Secret,
follow the pod, and leave nothing behind (per run, at kernel exit, and after a crashed kernel).

Steady-state API traffic of a one-shot cell: create Pod, create Secret, one pod watch, one log follow,
delete Pod (the Secret goes with it through its owner reference). The inventory comes from a watch-fed
cache that lives as long as the kernel; the namespace's offloading is checked once per cluster.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kubernetes.client import ApiClient
from kubernetes.utils import parse_quantity

from ....liqo_peering.cache import InventoryCache
from ....liqo_peering.client import LiqoClient, api_client_from_environment
from ....liqo_peering.errors import APIError, APIForbidden, GpuOffloadError, PlacementError
from ....liqo_peering.placement import POLICIES, PlacementRequest, place
from ....liqo_peering.placement import Placement as Where
from ....liqo_peering.specs import MAX_SECRET_BYTES, RunnerPodSpec, runner_secret, runner_selector
from ...errors import OffloadError, OffloadUsageError
from ...runner.frames import Outputs
from ..base import Job, Placement, SessionInfo, Transfer
from .config import KubeSettings
from .explain import MEMORY_ENV, PodContext
from .follow import PodFollower
from .hub_inventory import HubInventory
from .pods import PodApi
from .podspec import cell_pod, fetched_outputs, with_output_urls
from .run import KubeRun, LaunchedPod
from .session import KubeSession, SessionRun
from .storage import RunStorage

DEADLINE_MARGIN = 30
"""Seconds the pod's activeDeadlineSeconds adds to --timeout: the engine interrupts first, the deadline is
the backstop for a kernel that went away."""


class ClusterError(OffloadError):
    """The cluster refused or failed a step of launching or following a cell."""


def memory_bytes(quantity: str | None) -> int:
    """``GPU_OFFLOAD_MEMORY`` in bytes for placement (0 when unset); a clear error when it is not a quantity."""
    if not quantity:
        return 0
    try:
        return int(parse_quantity(quantity))
    except ValueError:
        raise OffloadUsageError(
            f"{MEMORY_ENV}={quantity!r} is not a Kubernetes memory quantity. Nothing was launched. Set it like "
            f"`%env {MEMORY_ENV}=32Gi` (or 500Mi), or unset it for the image's default.") from None


_QUOTA = re.compile(r"exceeded quota: ([^,]+), requested: (.+), used: (.+), limited: (.+)$")


def _translate(exc: GpuOffloadError) -> OffloadError:
    if isinstance(exc, PlacementError):
        return OffloadUsageError(f"Nothing was launched: {exc}.")
    quota = _QUOTA.search(exc.detail) if isinstance(exc, APIForbidden) else None
    if quota is not None:
        name, requested, used, limited = quota.groups()
        return OffloadUsageError(
            f"Your namespace's quota {name} is used up: this cell asks for {requested}, your runs and "
            f"sessions already hold {used}, and the limit is {limited}. Nothing was launched. Wait for a run "
            "to end, close a session you no longer need (`%gpu_offload sessions`, `%gpu_offload close NAME`), "
            "ask for fewer GPUs, or ask your JupyterHub admin for a larger share.")
    return ClusterError(f"{exc}. Nothing is left running for this cell.")


class KubernetesBackend:
    """Runs each cell in a pod on a Liqo virtual node of a donor cluster."""

    name = "kubernetes"

    def __init__(self, settings: KubeSettings, api_client: ApiClient | None = None,
                 storage: RunStorage | None = None, runner: Path | None = None) -> None:
        self.settings = settings
        self.api_client = api_client or api_client_from_environment()
        self.pods = PodApi(self.api_client, settings.namespace)
        self.liqo = LiqoClient(self.api_client, request_timeout=30)
        self.storage = storage or (RunStorage(settings.storage) if settings.storage else None)
        self.transfer = Transfer(output_transport="inline")
        self._runner_path = runner
        self._runner: bytes | None = None
        self._cache: InventoryCache | HubInventory | None = None
        self._offloaded: set[str] = set()
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()  # taken inside _lock when a session's first pod is placed
        self._sessions: dict[str, KubeSession] = {}
        self.cleaned: list[str] = []
        """What an earlier life of this kernel left behind, removed at start."""
        # best effort: a server account without list rights on Secrets must still be able to run cells
        with contextlib.suppress(ClusterError):
            self.cleaned = self.cleanup()

    def describe(self) -> str:
        """One line for ``%gpu_offload status``."""
        storage = f", storage s3://{self.settings.storage.bucket}" if self.settings.storage else ", no object storage"
        return (f"kubernetes backend: namespace {self.settings.namespace}, image {self.settings.image}"
                f"{storage}, user {self.settings.user}, kernel {self.settings.kernel}")

    # --- what a launch needs ---

    def inventory_cache(self) -> InventoryCache | HubInventory:
        """The kernel's inventory source, started on first use: the hub service's in a hub deployment (users
        may not list cluster-wide), else a watch-fed cache of the cluster."""
        with self._cache_lock:
            if self._cache is None:
                if self.settings.service_url:
                    self._cache = HubInventory(self.settings.service_url, self.settings.hub_token)
                else:
                    self._cache = InventoryCache(self.liqo).start()
            return self._cache

    def runner_bytes(self) -> bytes:
        """The runner zipapp that travels in every Secret (stock images need nothing installed)."""
        if self._runner is None:
            if self._runner_path is None:
                from ...runner.build import build_runner

                self._runner_path = Path(build_runner())
            self._runner = self._runner_path.read_bytes()
        return self._runner

    def where(self, placement: Placement, avoid: set[str], memory: str | None = None) -> Where:
        """The virtual node for ``placement`` (with ``memory`` free, a quantity) from the cached inventory, then
        the namespace offloaded there."""
        if placement.gpus < 1:
            raise OffloadUsageError(
                f"--gpus {placement.gpus}: the kubernetes backend runs cells on donated GPUs; ask for --gpus 1 "
                "or more, or run CPU-only cells with --backend local.")
        request = PlacementRequest(placement.gpus, placement.gpu_model, placement.cluster or "auto",
                                   memory=memory_bytes(memory))
        policy = POLICIES.get(self.settings.policy)
        if policy is None:
            raise OffloadUsageError(f"placement policy {self.settings.policy!r} is unknown; use one of "
                                    f"{', '.join(POLICIES)}")
        chosen = place(self.inventory_cache().inventory(), request, policy, avoid=avoid)
        if chosen.cluster_id not in self._offloaded:
            try:
                self.liqo.ensure_offloading(self.settings.namespace, [chosen.cluster_id],
                                            create=self.settings.create_offloading,
                                            timeout=self.settings.offloading_timeout)
            except APIForbidden:
                if self.settings.create_offloading:
                    raise
                # a hub user's server may not read it: the hub offloaded the namespace when the server
                # started, and if it did not, the pod's OffloadingBackOff is explained in words
            self._offloaded.add(chosen.cluster_id)
        return chosen

    def _spec(self, run_id: str, placement: Placement, where: Where, session: bool,
              env: dict[str, str]) -> RunnerPodSpec:
        return RunnerPodSpec(
            run_id=run_id, namespace=self.settings.namespace, image=placement.image or self.settings.image,
            user=self.settings.user, kernel=self.settings.kernel, scheduling=where.scheduling_fragment(),
            timeout=None if placement.timeout is None or session else math.ceil(placement.timeout) + DEADLINE_MARGIN,
            python=self.settings.python, session=session, env={**placement.env, **env}, server=self.settings.server,
            kernel_pid=os.getpid(), metered=self.settings.metered,
        )

    def launch(self, run_id: str, bundle: bytes, nonce: str, placement: Placement, avoid: set[str],
               session: bool = False, env: dict[str, str] | None = None) -> LaunchedPod:
        """Place, then create the Pod and its Secret; nothing is left behind if a step fails.

        ``avoid`` is non-empty for a retry elsewhere, which a cell pinned with ``--cluster`` does not get.
        """
        if avoid and placement.cluster and placement.cluster != "auto":
            raise OffloadUsageError(f"the cell asked for --cluster {placement.cluster} (drop it to let placement "
                                    "choose)")
        runner = self.runner_bytes()
        memory = os.environ.get(MEMORY_ENV) or None
        where = self.where(placement, avoid, memory)
        bundle_url = None
        if len(bundle) + len(runner) > MAX_SECRET_BYTES:
            bundle_url = self._store_bundle(run_id, bundle, len(runner))
            bundle = b""
        spec = self._spec(run_id, placement, where, session, env or {})
        body = cell_pod(spec, memory, bundle_url)
        created = self.pods.create(body)
        try:
            self.pods.create(runner_secret(body, created["metadata"]["uid"], bundle, runner))
        except BaseException:
            self.pods.delete_pod(body["metadata"]["name"], grace=0)
            raise
        ctx = PodContext(where.cluster_id, where.gpus, spec.image, memory)
        follower = PodFollower(self.pods, created, nonce, ctx, one_shot=not session,
                               watch_seconds=self.settings.watch_seconds)
        return LaunchedPod(body["metadata"]["name"], ctx, follower)

    def _store_bundle(self, run_id: str, bundle: bytes, runner_size: int) -> str:
        if self.storage is None:
            size = len(bundle) + runner_size
            raise OffloadUsageError(
                f"This cell's inputs make a bundle of {len(bundle) / 2**20:.1f} MiB; with the runner "
                f"({size / 2**20:.1f} MiB) it does not fit in a Kubernetes Secret (at most "
                f"{MAX_SECRET_BYTES / 2**20:.2f} MiB) and no object storage is configured. Nothing was "
                "launched. Set GPU_OFFLOAD_S3_BUCKET (and GPU_OFFLOAD_S3_ENDPOINT for a non-AWS store) to "
                "send large inputs through object storage, or load the data inside the cell.")
        return self.storage.upload(run_id, "bundle.pkl", bundle)

    # --- the Backend protocol ---

    def submit(self, job: Job, placement: Placement, session: str | None = None) -> KubeRun | SessionRun:
        """Start ``job`` in a new pod, or in the named session's warm pod."""
        bundle = job.bundle
        if self.storage is not None:
            bundle = with_output_urls(bundle, self.storage.output_urls(job.run_id))
        try:
            if session is not None:
                return self._session(session, placement).submit(
                    bundle, lambda: self._forget_run(job.run_id), self._fetcher(job.run_id))
            launched = self.launch(job.run_id, bundle, job.nonce, placement, set())
        except GpuOffloadError as exc:
            self._forget_run(job.run_id)
            raise _translate(exc) from exc
        except BaseException:
            self._forget_run(job.run_id)
            raise

        def relaunch(avoid: set[str]) -> LaunchedPod:
            return self.launch(f"{job.run_id}-r", bundle, job.nonce, placement, avoid)

        return KubeRun(self.pods, launched, relaunch, cleanup=lambda: self._forget_run(job.run_id),
                       fetch=self._fetcher(job.run_id))

    def _fetcher(self, run_id: str) -> Callable[[Outputs], Outputs] | None:
        storage = self.storage
        if storage is None:
            return None

        def read(index: int) -> bytes:
            key = storage.key(run_id, f"out-{index}")
            return bytes(storage.client.get_object(Bucket=storage.settings.bucket, Key=key)["Body"].read())

        def fetch(outputs: Outputs) -> Outputs:
            packed, refs = fetched_outputs(outputs.pickle, outputs.buffers, read)
            return replace(outputs, pickle=packed, buffers=tuple(refs))

        return fetch

    def _forget_run(self, run_id: str) -> None:
        if self.storage is not None:
            self.storage.remove_run(run_id)

    def _session(self, name: str, placement: Placement) -> KubeSession:
        with self._lock:
            current = self._sessions.get(name)
            replaces = ""
            if current is not None and not current.alive:
                replaces = current.launched.name
                current.close(grace=0)
                del self._sessions[name]
                current = None
            if current is None:
                current = self._sessions[name] = KubeSession(name, self, placement, replaces)
            elif current.placement != placement:
                raise OffloadUsageError(
                    f"Session `{name}` was started with --gpus {current.placement.gpus} on "
                    f"{current.launched.ctx.cluster}; this cell asks for something else. Close it with "
                    f"`%gpu_offload close {name}` first, or use another --session name.")
            return current

    def sessions(self) -> list[SessionInfo]:
        """The warm session pods that are still alive."""
        with self._lock:
            return [s.info() for s in self._sessions.values() if s.alive]

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        """End the named session and delete its pod; ``False`` if there is none."""
        with self._lock:
            current = self._sessions.pop(name, None)
        if current is None:
            return False
        current.close(grace)
        return True

    def cleanup(self, everything_of_user: bool = False) -> list[str]:
        """Delete the pods and Secrets this kernel (or, with the flag, any kernel of this user) left behind.

        Label-based, so it works after a crash: a restarted Jupyter kernel keeps its kernel id.
        """
        kernel = None if everything_of_user else self.settings.kernel
        try:
            return self.pods.delete_matching(runner_selector(self.settings.user, kernel))
        except APIError as exc:
            raise ClusterError(f"cleaning up leftover runner pods failed: {exc}") from exc

    def close(self) -> None:
        """Kernel exit: end every session, delete whatever this kernel still has, stop the watches."""
        for name in list(self._sessions):
            self.close_session(name, grace=1.0)
        # the cluster may be unreachable at exit: the next start of this kernel cleans up then
        with contextlib.suppress(ClusterError):
            self.cleanup()
        if self._cache is not None:
            self._cache.close(timeout=1.0)
