"""The kubernetes backend: one-shot runs and warm sessions in runner pods its :class:`~.launcher.PodLauncher`
places and creates; it follows them and leaves nothing behind (per run, at kernel exit, and after a
crashed kernel).

Steady-state API traffic of a one-shot cell: create Pod, create Secret, one pod watch, one log follow,
delete Pod (the Secret goes with it through its owner reference). The inventory comes from a watch-fed
cache that lives as long as the kernel; the namespace's offloading is checked once per cluster.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ....liqo_peering import environment as E
from ....liqo_peering.cache import InventoryCache
from ....liqo_peering.client import ApiClient, LiqoClient, api_client_from_environment
from ....liqo_peering.errors import (
    APIDeniedByPolicy,
    APIError,
    APIForbiddenByQuota,
    APINamespaceMissing,
    APIWebhookUnavailable,
    GpuOffloadError,
    PlacementError,
)
from ....liqo_peering.inventory import Inventory
from ....liqo_peering.settings import RunDefaults, kernel_settings, run_defaults
from ....liqo_peering.specs import runner_selector
from ....liqo_peering.trust import apply_policy, run_trusted, trusting
from ....liqo_peering.wording import duration
from ....runner.frames import Outputs
from ...errors import OffloadError, OffloadUsageError
from ..base import Job, RunRequest, SessionInfo, Transfer
from ..checkpoint_book import SessionLost
from .config import KubeSettings
from .drain import DrainStep, drain_step, waiting_step
from .drain_watch import DrainWatch
from .host import Launched, WarmSession
from .hub_inventory import HubInventory
from .idle import IdleTimeouts, release_words
from .jobrun import KubeJobRun
from .launcher import PodLauncher
from .plan import EITHER, PodOrder
from .pods import PodApi
from .podspec import fetched_outputs, same_object, untrusted_unfetched
from .queueing import Ticket
from .rank_checkpoints import shape_refusal
from .rank_session import KubeRankSession, RankSessionRun
from .resume import IdleEnded, SessionKeeper, resume_differences, resume_key, why_not_kept
from .run import KubeRun
from .session import KubeSession, SessionRun
from .storage import LOG, OUTPUT_URLS, RunStorage, StorageError
from .user_runs import UserPods


class ClusterError(OffloadError):
    """The cluster refused or failed a step of launching or following a cell."""


DRAIN_CHECK_SECONDS = 2.0
"""How long a session's cell waits for the inventory to learn whether its node is cordoned (the first read)."""
DRAIN_SETTLE_SECONDS = 2.0
"""How long the drain watch lets a cordon stand before moving an idle session: ``kubectl drain`` evicts right
after its cordon, and then the pod's SIGTERM checkpoint keeps the state (its next cell resumes it); a move raced
against that eviction would only add a second pod. A pod being deleted by then is not moved."""


def _translate(exc: GpuOffloadError) -> OffloadError:
    if isinstance(exc, PlacementError):
        return OffloadUsageError(f"Nothing was launched: {exc}.")
    if isinstance(exc, APINamespaceMissing):
        name = exc.namespace
        return OffloadUsageError(
            f"Nothing was launched: namespace {name} does not exist on the cluster. Create it with `kubectl create "
            f"namespace {name}` (a hub creates each user's for you), or set {E.NAMESPACE.name} to one that exists.")
    if isinstance(exc, APIDeniedByPolicy):
        # the chart's policies: the queue label, a priority class the user may not use, an image not allowed
        return OffloadUsageError(f"Nothing was launched: the cluster's admission policy {exc.policy} refused the "
                                 f"pod: {exc.denial}.")
    if isinstance(exc, APIWebhookUnavailable):
        return ClusterError(f"Nothing was launched: {exc.action} {exc.target} was refused because {exc.next_step}.")
    if isinstance(exc, APIForbiddenByQuota):
        quota = exc.quota
        return OffloadUsageError(
            f"Your namespace's quota {quota.name} is used up: this cell asks for {quota.requested}, your runs and "
            f"sessions already hold {quota.used}, and the limit is {quota.limited}. Nothing was launched. Wait for a run "
            "to end, close a session you no longer need (`%gpu_offload sessions`, `%gpu_offload close NAME`), "
            "ask for fewer GPUs, or ask your JupyterHub admin for a larger share.")
    return ClusterError(f"{exc}. Nothing is left running for this cell.")


class _Unmoved(Exception):
    """A drained session's move failed (``cause``): before anything was touched (``kept``), or after it was
    checkpointed and closed, when its restore elsewhere failed."""

    def __init__(self, cause: BaseException, kept: bool) -> None:
        super().__init__(str(cause))
        self.cause, self.kept = cause, kept


class KubernetesBackend:
    """Runs each cell in a pod on a Liqo virtual node of a donor cluster."""

    name = "kubernetes"

    def __init__(self, settings: KubeSettings, api_client: ApiClient | None = None,
                 storage: RunStorage | None = None, runner: Path | None = None) -> None:
        self.settings = settings
        self.api_client = api_client or api_client_from_environment()
        self.pods = PodApi(self.api_client, settings.namespace)
        self._user_pods = UserPods(self.pods, settings.user)
        self.watch_seconds = settings.watch_seconds
        self.trust = trusting(settings.trusted)
        """The origin's trust, built once: placement, the runner pods' output format and the intake of outputs."""
        self.liqo = LiqoClient(self.api_client, request_timeout=30, trust=self.trust)
        self.storage = storage or (RunStorage(settings.storage, settings.user) if settings.storage else None)
        self.launcher = PodLauncher(settings, self.pods, self.liqo, self.storage, self.trust, runner)
        self.idle_timeouts = IdleTimeouts(settings.session_idle_timeout)
        """Each session's idle timeout: the hub's, or a shorter ``--idle-timeout``."""
        self.keeper = SessionKeeper(self.storage, self.trusts, self.idle_timeouts.of)
        """Checkpoints of the sessions (to the user's storage) and their resumes after a loss or a release."""
        self._lock = threading.Lock()
        self._sessions: dict[str, KubeSession | KubeRankSession] = {}
        self._idle_ended: dict[str, IdleEnded] = {}
        """Sessions this kernel ended for idling: said at the next cell of that session and in ``%gpu_offload
        status`` until then."""
        self._gates: dict[str, Any] = {}
        """Session -> the re-entrant lock a cell's start and a move hold: the drain watch moves no session a cell
        is being handed to, and a cell waits for a move under way."""
        self._drain_watch: DrainWatch | None = None
        self._drain_notes: dict[str, tuple[str, bool]] = {}
        """Sessions the drain watch moved while idle: what their next cell is told, once."""
        self._drain_lines: dict[str, str] = {}
        """Sessions on a drained donor, what ``%gpu_offload sessions`` says: moved while idle, or why they stay."""
        self._drain_tried: set[str] = set()
        """Holders (``pod NAME``) the drain watch could not move: their next cell tries again, the watch does not."""
        self._cordon_seen: dict[str, float] = {}
        """Holders the drain watch saw on a cordoned node, since when (monotonic)."""
        self.cleaned: list[str] = []
        """What an earlier life of this kernel left behind, removed at start."""
        # best effort: a server account without list rights on Secrets must still be able to run cells
        with contextlib.suppress(ClusterError):
            self.cleaned = self.cleanup()

    def describe(self) -> str:
        """One line for ``%gpu_offload status``."""
        storage = f", storage s3://{self.settings.storage.bucket}" if self.settings.storage else ", no object storage"
        image = self.settings.image or "the runner image of this kernel's Python"
        line = (f"kubernetes backend: namespace {self.settings.namespace}, image {image}"
                f"{storage}, user {self.settings.user}, kernel {self.settings.kernel}")
        with self._lock:
            ended = [f"session {name}: its {idle.holder} {idle.how}; {self.keeper.next_cell(name)}"
                     for name, idle in self._idle_ended.items()]
            # ended on their own while idle (preempted by Kueue, node lost): said until the session is used again
            ended += [f"session {name}: its {s.holder} {s.end_words()}; {self.keeper.next_cell(name)}"
                      for name, s in self._sessions.items() if not s.alive and not s.dead]
        returned = self.keeper.returned()
        if returned:
            ended.append(f"GPU-hours given back by idle sessions released with a checkpoint: {returned:.3f}")
        if self.launcher.spend is not None:
            ended.append(self.launcher.spend.line(self.settings.budget))
        return "\n".join([line, *ended])

    def transfer(self, run_id: str) -> Transfer:
        """Inputs inline (a bundle too large for the Secret is stored whole); outputs inline in the frames, or
        uploaded to presigned URLs of this run when object storage is configured."""
        if self.storage is None:
            return Transfer(input_transport="inline", output_transport="inline")
        # a CLI run's log outlives its pod and whoever followed it (gpu-offload logs reads it)
        return Transfer(input_transport="inline", output_transport="url",
                        output_urls=tuple(self.storage.output_urls(run_id)),
                        log_url=self.storage.log_url(run_id) if self.settings.cli else "")

    def inventory(self) -> InventoryCache | HubInventory:
        """The kernel's inventory source (started on first use), shared with the panel: the hub service's in a
        hub deployment, else a watch-fed cache of the cluster."""
        return self.launcher.inventory_cache()

    def user_runs(self) -> UserPods:
        """The user's runs in the namespace, from their runner pods, over this backend's own client."""
        return self._user_pods

    def trusts(self, cluster: str) -> bool:
        """Whether ``cluster`` is one of the settings' trusted ids (``GPU_OFFLOAD_TRUSTED_CLUSTERS``, which a
        hub's spawner writes from its chart): the same policy placement and the runner pods are given. A spread
        Job's run is on ``a or b`` (its out rank may land on either): trusted when every one is, as placement
        decided when it told the runners their output format."""
        return all(run_trusted(self.name, one, self.trust) for one in cluster.split(EITHER))

    # --- the Backend protocol ---

    def submit(self, job: Job) -> KubeRun | KubeJobRun | SessionRun | RankSessionRun:
        """Start ``job`` in a new pod (a Job of pods for a distributed run), or in the named session's."""
        try:
            if job.session is not None:
                return self._session_cell(job)
            order = PodOrder(job.run_id, job.nonce, job.request, job.bundle, bundle_run=job.run_id,
                             defaults=self.run_defaults(), preimport=job.preimport)
            return KubeRun(self, order) if job.request.ranks is None else KubeJobRun(self, order)
        except GpuOffloadError as exc:
            self.released(job.run_id)
            raise _translate(exc) from exc
        except BaseException:
            self.released(job.run_id)
            raise

    def _session_cell(self, job: Job) -> SessionRun | RankSessionRun:
        assert job.session is not None
        self._watch_drains()
        with self._gate(job.session):  # until the session is busy with this cell: the drain watch moves it not
            self.keeper.settle(job.session)  # a checkpoint still being written goes first
            drained = self._leave_drained(job.session)
            session = self._session(job.session, job.request)
            with self._lock:
                idle = self.idle_timeouts.ask(job.session, job.request.idle_timeout)
            note = self.keeper.note(job.session)
            pending, session.unrestored = self.keeper.resume(session) or session.unrestored, None
            run = session.submit(job.bundle, job.run_id)
        for told in (drained, idle, note):
            if told is not None:
                text, warning = told
                (run.warn if warning else run.announce)(text)
        if pending is not None:  # done by the cell once the new pod runs, so the wait for it is shown meanwhile
            run.restore_first(pending)
        return run

    def _gate(self, name: str) -> Any:
        with self._lock:
            return self._gates.setdefault(name, threading.RLock())

    def _leave_drained(self, name: str) -> tuple[str, bool] | None:
        """A live, idle session whose node is cordoned (its donor is being drained) moves before its next cell,
        through the move path, or says why it stays (``drain.drain_step``); what the cell is told. A session the
        drain watch moved while it idled says that instead."""
        with self._lock:
            current = self._sessions.get(name)
            moved = self._drain_notes.pop(name, None)
            self._drain_lines.pop(name, None)
        if moved is not None:
            return moved
        if current is None or not current.alive or current.busy:
            return None
        try:  # a short wait: the check must not hold a cell up for long (the cache's refusal is known at once)
            inventory = self.inventory().inventory(timeout=DRAIN_CHECK_SECONDS)
        except GpuOffloadError:  # no inventory to read: the drain's eviction ends the session, the next cell resumes
            return None
        step = self._drain_step(current, inventory)
        if step is None:
            return None
        if not step.move:
            return f"session {name}: {step.text}", True
        try:
            return self._move_drained(name, current, step, "before this cell"), True
        except _Unmoved as failed:
            if failed.kept:  # the checkpoint failed: the session was not touched
                return f"session {name}: {step.why}; it could not be moved ({failed.cause}): the cell runs there", True
            raise OffloadUsageError(
                f"session {name}: {step.why}; it was checkpointed and closed, but could not be started elsewhere "
                f"({failed.cause}); `%gpu_offload restore {name}` starts it from that checkpoint once a donor has "
                "room") from failed.cause

    def _drain_step(self, session: KubeSession | KubeRankSession, inventory: Inventory) -> DrainStep | None:
        """``drain.drain_step`` for ``session``'s pod (a distributed session's pods), placed as its launch is."""
        nodes = [f.node for f in session.followers() if f.node]
        if not nodes:
            return None
        return drain_step(nodes, session.request, apply_policy(inventory, self.trust),
                          why_not_kept(session.request, self.keeper.checkpoints is not None),
                          self.settings.policy, session.order.defaults.memory)

    def _move_drained(self, name: str, current: KubeSession | KubeRankSession, step: DrainStep, when: str) -> str:
        """Move ``current`` off its drained donor (``move_session``); what is said of it. Raises ``_Unmoved``."""
        old = current.cluster
        try:
            _, restored = self.move_session(name, grace=1.0, changed_only=True)
        except (OffloadError, GpuOffloadError, SessionLost, StorageError) as exc:
            with self._lock:
                kept = name in self._sessions
            raise _Unmoved(exc, kept) from exc
        with self._lock:
            moved = self._sessions.get(name)
        where = moved.cluster if moved is not None else "another donor"
        # the restore's words: "resumed on WHERE (waited ...)"; restored from checkpoint ..."
        restored = restored.removeprefix(f"session {name}: ").removeprefix(f"resumed on {where} ")
        return f"session {name}: {step.why}; moved this session from {old} to {where} {when} {restored}"

    def _watch_drains(self) -> None:
        """Start the drain watch with the first session cell, over the kernel's own inventory cache (a hub's
        inventory is read on demand, not watched: there a session's next cell moves it)."""
        with self._lock:
            if self._drain_watch is not None:
                return
        source = self.inventory()
        with self._lock:
            if self._drain_watch is None and isinstance(source, InventoryCache):
                self._drain_watch = DrainWatch(source, self._look_for_drains).start()

    def _look_for_drains(self) -> None:
        """The drain watch's look: each idle session whose node is cordoned is moved now, or says why it stays."""
        with self._lock:
            idle = [s for s in self._sessions.values() if s.alive and not s.busy]
        if not idle:
            return
        inventory = self.inventory().inventory(timeout=0)  # the watch looks again at the next change
        for session in idle:
            self._drain_idle(session, inventory)

    def _being_deleted(self, session: KubeSession | KubeRankSession) -> bool:
        """Whether a pod of ``session`` is being deleted (evicted) as the inventory's Pod watch last saw it."""
        source = self.inventory()
        if not isinstance(source, InventoryCache):
            return False
        names = {f.name for f in session.followers()}
        return any(meta.get("name") in names and meta.get("namespace") == self.settings.namespace
                   and meta.get("deletionTimestamp")
                   for meta in ((pod.get("metadata") or {}) for pod in source.objects("Pod")))

    def _drain_idle(self, session: KubeSession | KubeRankSession, inventory: Inventory) -> None:
        name = session.name
        step = self._drain_step(session, inventory)
        if step is None or not step.move:
            with self._lock:
                if step is None:
                    self._drain_lines.pop(name, None)
                    self._cordon_seen.pop(session.holder, None)
                else:
                    self._drain_lines[name] = step.idle
            return
        since = self._cordon_seen.setdefault(session.holder, time.monotonic())
        wait = DRAIN_SETTLE_SECONDS - (time.monotonic() - since)
        if wait > 0:
            if self._drain_watch is not None:
                self._drain_watch.again_in(wait)
            return
        gate = self._gate(name)
        if session.holder in self._drain_tried or self._being_deleted(session) or not gate.acquire(blocking=False):
            return  # a cell is being handed to it: that cell's own check moves it
        try:
            with self._lock:
                if self._sessions.get(name) is not session or not session.alive or session.busy:
                    return
                session.claims += 1  # an idle timer set earlier ends nothing now
                release_at = session.release_at
            at = time.strftime("%H:%M:%S UTC", time.gmtime())
            try:
                text = self._move_drained(name, session, step, f"at {at}, while it was idle and before this cell")
            except _Unmoved as failed:
                with self._lock:
                    if failed.kept:  # its next cell tries again; its idle release keeps its time
                        self._drain_tried.add(session.holder)
                        self._drain_lines[name] = f"{step.why}; it could not be moved ({failed.cause})"
                        if release_at is not None:
                            self._start_idle_timer(session, max(0.0, release_at - time.time()))
                    else:  # its next cell resumes it from the checkpoint, as after an idle release
                        self._idle_ended[name] = IdleEnded(session.holder, (
                            f"was checkpointed and closed at {at} because {step.why}, but could not be started "
                            f"elsewhere ({failed.cause})"), session.request)
                return
            with self._lock:
                self._cordon_seen.pop(session.holder, None)
                self._drain_notes[name] = (text, True)
                self._drain_lines[name] = f"moved from {session.cluster} at {at}, while idle: {step.why}"
                fresh = self._sessions.get(name)
            if fresh is not None and release_at is not None:  # the idle release keeps its time
                self._start_idle_timer(fresh, max(0.0, release_at - time.time()))
        finally:
            gate.release()

    # --- the Host protocol: what runs and sessions ask of the backend and tell it ---

    def launch(self, order: PodOrder, avoid: frozenset[str] = frozenset()) -> Launched:
        """See :meth:`.host.Host.launch`."""
        return self.launcher.launch(order, avoid)

    def run_defaults(self) -> RunDefaults:
        """See :meth:`.host.Host.run_defaults`: the kernel's run defaults as its environment holds them now (a
        notebook's ``%env GPU_OFFLOAD_MEMORY=...``, which an out-of-memory failure suggests, applies to the next
        run), in the one form every front end uses (``settings.run_defaults``)."""
        return run_defaults(kernel_settings())

    def cordoned(self, node: str, order: PodOrder) -> DrainStep | None:
        """See :meth:`.host.Host.cordoned`."""
        try:  # the cache answers at once once listed; a refusal is known at once too
            inventory = self.inventory().inventory(timeout=DRAIN_CHECK_SECONDS)
        except GpuOffloadError:
            return None
        return waiting_step(node, order.placement, apply_policy(inventory, self.trust), self.settings.policy,
                            order.defaults.memory)

    def leave(self, ticket: Ticket) -> None:
        """See :meth:`.host.Host.leave`."""
        self.launcher.leave(ticket)

    def fetched(self, run_id: str, outputs: Outputs, cluster: str) -> Outputs:
        """See :meth:`.host.Host.fetched`: what the run uploaded to object storage, read back; an untrusted
        cluster's pickle or buffer references are not even downloaded."""
        storage = self.storage
        if storage is None:
            return outputs
        if not self.trusts(cluster):  # the engine's own test of the run's cluster
            unread = untrusted_unfetched(outputs.format, outputs.pickle, outputs.buffers)
            if unread is not None:
                return replace(outputs, pickle=unread)

        def read(ref: Mapping[str, Any]) -> bytes:
            index = ref.get("index")
            if not isinstance(index, int) or not 0 <= index < OUTPUT_URLS:
                raise StorageError(f"an output reference names upload {index!r}; a run has uploads 0 to "
                                   f"{OUTPUT_URLS - 1}. Nothing was loaded")
            return storage.read(run_id, f"out-{index}", ref.get("sha256"), ref.get("size"))

        def own(index: int, url: str) -> bool:
            return 0 <= index < OUTPUT_URLS and same_object(url, storage.put_url(run_id, f"out-{index}"))

        packed, refs = fetched_outputs(outputs.pickle, outputs.buffers, read, own)
        return replace(outputs, pickle=packed, buffers=tuple(refs))

    def released(self, run_id: str) -> None:
        """See :meth:`.host.Host.released`: the run's stored objects go (a CLI run keeps its log)."""
        if self.storage is not None:
            self.storage.remove_run(run_id, keep=(LOG,) if self.settings.cli else ())

    def idle(self, session: WarmSession) -> None:
        """See :meth:`.host.Host.idle`: checkpoint the session if it changed (in the background), then its idle
        timer."""
        if isinstance(session, (KubeSession, KubeRankSession)):
            self.keeper.after_cell(session, self._went_idle)

    def _went_idle(self, session: KubeSession | KubeRankSession) -> None:
        """After a cell's checkpoint: the idle timer, and a look at the drains (its node may be cordoned now)."""
        self._start_idle_timer(session)
        if self._drain_watch is not None:
            self._drain_watch.poke()

    def _session(self, name: str, placement: RunRequest) -> KubeSession | KubeRankSession:
        with self._lock:
            current = self._sessions.get(name)
            if current is not None and not current.alive:
                self._check_resume(name, current.request, current.holder, current.end_words(), placement)
            released = self._idle_ended.get(name)
            if current is None and released is not None:
                self._check_resume(name, released.request, released.holder, released.how, placement)
            self._idle_ended.pop(name, None)
            replaces, ended = (released.holder, released.how) if released is not None else ("", "")
            if current is not None and not current.alive:
                replaces, ended = current.holder, current.end_words()
                current.close(grace=0)
                del self._sessions[name]
                current = None
            if current is None:
                current = self._sessions[name] = self._new_session(name, placement, replaces,
                                                                   ended or "ended while idle")
            elif (current.request.session_key() != placement.session_key()
                  and not self.keeper.fits(name, placement)):
                raise OffloadUsageError(
                    f"Session `{name}` was started with {current.request.shape()} on {current.cluster}; this "
                    f"cell asks for {placement.shape()} or another place. Close it with `%gpu_offload close "
                    f"{name}` first, or use another --session name.")
            current.claims += 1  # from now on an idle timer set earlier ends nothing
            return current

    def _check_resume(self, name: str, was: RunRequest, holder: str, how: str, placement: RunRequest) -> None:
        """A cell for session ``name``, whose pod ended on its own (preempted, drained, lost, released while idle),
        resumes it from its checkpoint: it may land elsewhere (as ``%gpu_offload move`` does; the old cluster may
        be gone), but asks for the session's shape, or the resumed session would silently hold other GPUs, another
        priority or trust, and a full checkpoint could be refused on the new place. Raises before anything is
        created or forgotten, so the checkpoint and the ended session's words stay."""
        if resume_key(was) == resume_key(placement) or self.keeper.fits(name, placement):
            return
        raise OffloadUsageError(
            f"Session `{name}` ran with {was.shape()} and its {holder} {how}; this cell asks for other options "
            f"({resume_differences(was, placement)}). Run it with the session's options to "
            f"{self.keeper.resume_words(name, was)}, or close it with `%gpu_offload close {name}` to start afresh "
            "with these options.")

    def _new_session(self, name: str, placement: RunRequest, replaces: str,
                     ended: str) -> KubeSession | KubeRankSession:
        if placement.ranks is None:
            return KubeSession(name, self, placement, replaces, ended)
        # a distributed session: one Indexed Job of session launchers, one attachment per pod
        return KubeRankSession(name, self, placement, replaces, ended)

    def _start_idle_timer(self, session: KubeSession | KubeRankSession, seconds: float | None = None) -> None:
        """End the session if no cell comes within the idle timeout (or ``seconds``: what was left of it when a
        drain moved the session), so nobody keeps GPUs by forgetting a session (the chart's
        ``offload.sessionIdleTimeout``)."""
        if session.dead or session.busy:
            return
        timeout = self.idle_timeouts.of(session.name).seconds
        if timeout <= 0:
            return
        timeout = timeout if seconds is None else seconds
        timer = threading.Timer(timeout, self._end_idle, (session, session.claims))
        timer.daemon = True
        session.idle_timer, session.release_at = timer, time.time() + timeout
        timer.start()

    def _end_idle(self, session: KubeSession | KubeRankSession, claims: int) -> None:
        request = session.request
        gpus = request.gpus * (request.ranks.nodes if request.ranks is not None else 1)
        if self._sessions.get(session.name) is not session or session.busy or session.claims != claims:
            return
        timeout = self.idle_timeouts.of(session.name)
        kept = self.keeper.before_release(session)  # the state first, while the pod is there
        with self._lock:
            # a cell came meanwhile, or the session was closed or replaced: nothing to end
            if self._sessions.get(session.name) is not session or session.busy or session.claims != claims:
                return
            del self._sessions[session.name]
            self.keeper.released(session.name, gpus)
            self._idle_ended[session.name] = IdleEnded(session.holder, (
                f"was ended after {duration(timeout.seconds, 'min')} idle holding {gpus} GPU"
                f"{'' if gpus == 1 else 's'} on {session.cluster} (the session idle timeout, "
                f"{timeout.source}){kept}"), request)
        session.close(grace=1.0)

    # --- checkpoints (see .resume) ---

    def _live(self, name: str) -> KubeSession | KubeRankSession:
        self.keeper.settle(name)
        with self._lock:
            current = self._sessions.get(name)
            if current is None or not current.alive:
                raise OffloadUsageError(f"no live session named {name!r} on the cluster; `%gpu_offload sessions` "
                                        "lists them")
            if current.busy:
                raise OffloadUsageError(f"session {name!r} is running a cell: checkpoint it between cells")
            return current

    def checkpoint_session(self, name: str, checkpoint: str, limit: int | None = None,
                           auto: bool | None = None) -> Any:
        """Write session ``name``'s state as checkpoint ``checkpoint`` to the user's storage."""
        return self.keeper.take(self._live(name), checkpoint, limit, auto)

    def restore_session(self, checkpoint: str, session: str | None = None,
                        placement: RunRequest | None = None) -> str:
        """Start session ``session`` (default: the checkpoint's own) from ``checkpoint``, in a new pod placed as
        ``placement`` asks (default: as the session was)."""
        saved = self.keeper.store().get(checkpoint)
        name = session or saved.session
        target = placement or saved.placement
        refusal = shape_refusal(saved.name, saved.placement.ranks, target.ranks, name)
        if refusal is not None:  # before anything is launched
            raise OffloadUsageError(refusal)
        with self._lock:
            current = self._sessions.get(name)
            if current is not None and current.alive:
                raise OffloadUsageError(f"session {name!r} is running: close it first (%gpu_offload close "
                                        f"{name}) or restore into another one (--session NEW)")
            self._idle_ended.pop(name, None)
            fresh = self._sessions[name] = self._new_session(name, target, "", "")
        try:
            return f"session {name}: " + self.keeper.restore(fresh, saved)
        except BaseException:
            self.close_session(name, grace=1.0)  # nothing half-restored is left running
            raise

    def move_session(self, name: str, cluster: str | None = None, gpu_model: str | None = None,
                     grace: float = 5.0, changed_only: bool = False) -> list[str]:
        """``%gpu_offload move``: checkpoint, close, restore in a new pod (on ``cluster`` or a ``gpu_model``);
        ``changed_only``: the session's last checkpoint serves when its state did not change since (a drain's)."""
        with self._gate(name):  # not while the drain watch moves it
            return self._move(name, cluster, gpu_model, grace, changed_only)

    def _move(self, name: str, cluster: str | None, gpu_model: str | None, grace: float,
              changed_only: bool) -> list[str]:
        current = self._live(name)
        placement = current.request
        if cluster:
            placement = replace(placement, cluster=cluster)
        if gpu_model:
            placement = replace(placement, gpu_model=gpu_model, fallback_models=())
        saved = self.keeper.take_if_changed(current) if changed_only else self.keeper.take(current, name, None, None)
        lines = [f"checkpoint {saved.describe()}"]
        self.close_session(name, grace)
        lines.append(self.restore_session(name, name, placement))
        self.keeper.moved(name, current.request)
        return lines

    def sessions(self) -> list[SessionInfo]:
        """The warm session pods that are still alive."""
        now = time.time()
        with self._lock:
            return [replace(s.info(), release="; ".join(w for w in (
                        s.protector.words(now) if isinstance(s, KubeSession) else "",
                        release_words(self.idle_timeouts.of(s.name), s.release_at, now),
                        self._drain_lines.get(s.name, "")) if w))
                    for s in self._sessions.values() if s.alive]

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        """End the named session and delete its pod (or forget one released while idle, so its next cell starts
        afresh); ``False`` if there is none."""
        self.keeper.settle(name)  # a checkpoint being written finishes first (its object is then removed at exit)
        with self._gate(name), self._lock:  # not while the drain watch moves it
            current = self._sessions.pop(name, None)
            idle = self._idle_ended.pop(name, None)
            self._drain_notes.pop(name, None)
            self._drain_lines.pop(name, None)
        if idle is not None:  # released while idle: its next cell would have resumed it; now it starts afresh
            self.keeper.forget(name)
        if current is None:
            return idle is not None
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
        if self._drain_watch is not None:
            self._drain_watch.close()
        for name in list(self._sessions):
            self.close_session(name, grace=1.0)
        # the cluster may be unreachable at exit: the next start of this kernel cleans up then
        with contextlib.suppress(ClusterError):
            self.cleanup()
        if self.keeper.checkpoints is not None:
            self._wait_runners_gone()
        self.keeper.close()
        self.launcher.close()

    def _wait_runners_gone(self) -> None:
        """Wait, within the pods' notice, until this kernel's runner pods are gone. A session runner stopped before
        it read its ``exit`` (a closing's grace ran out under load) writes the checkpoint armed for its SIGTERM as
        its pod ends: the stored objects are removed after that, or the record would outlive the kernel."""
        selector = runner_selector(self.settings.user, self.settings.kernel)
        deadline = time.monotonic() + self.settings.session_notice + 5
        while time.monotonic() < deadline:
            try:
                if not self.pods.list_pods(selector):
                    return
            except APIError:  # unreachable: the objects are removed now, the bucket's lifecycle rule does the rest
                return
            time.sleep(0.2)
