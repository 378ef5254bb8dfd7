"""Acting on a :class:`~.plan.LaunchPlan`: the one place the kube backend creates a run's objects.

In the plan's order: the namespace's offloading where the plan needs it, the bundle in object storage when
it is too large to send, then the Pod or Job, then what it owns (the runner's Secret, a Job's Service). A
step that fails (or Ctrl-C) undoes the steps before it, newest first, and the failure goes on: no Pod, Job,
Secret, Service or stored bundle of a launch that did not complete is left behind. The offloading stays: it
is the namespace's, shared by every run.

A Pod's create goes through :class:`~.creating.PodCreates`, so a create that Ctrl-C cut off still removes
the pod the server may have made.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ....liqo_peering.client import LiqoClient
from ....liqo_peering.errors import APIError, APIForbidden
from .config import KubeSettings
from .creating import PodCreates
from .plan import BUNDLE_OBJECT, LaunchPlan, Offloading
from .pods import PodApi
from .storage import LOG, RunStorage, Stored


@dataclass(frozen=True)
class Created:
    """What executing a plan made: the owner as the server stored it, and what its runner reads on stdin."""

    plan: LaunchPlan
    owner: Mapping[str, Any]
    """The Pod or Job as created (uid, resourceVersion)."""
    stdin: bytes
    """The bundle, sent on stdin once the runner starts (empty for a session, or when it was stored)."""
    placed_at: float = 0.0
    """When the namespace's offloading was in place (``time.monotonic()``): the end of the placement phase."""

    @property
    def name(self) -> str:
        return str(self.owner["metadata"]["name"])


class Executor:
    """Creates what launch plans say for one kernel; remembers what the namespace is offloaded to."""

    def __init__(self, settings: KubeSettings, pods: PodApi, liqo: LiqoClient, storage: RunStorage | None) -> None:
        self.settings = settings
        self.pods = pods
        self.liqo = liqo
        self.storage = storage
        self.creates = PodCreates(pods)
        self._offloaded: set[str] = set()
        self._lock = threading.Lock()

    @property
    def offloaded(self) -> frozenset[str]:
        """What the namespace was offloaded to by this kernel (the planner's :attr:`~.plan.Situation.offloaded`)."""
        with self._lock:
            return frozenset(self._offloaded)

    def execute(self, plan: LaunchPlan, bundle: bytes, runner: bytes) -> Created:
        """Do what ``plan`` says, with ``bundle`` (sent or stored) and the ``runner`` zipapp for its Secret;
        on any failure, undo what was done and raise it."""
        if plan.offloading is not None:
            self._offload(plan.offloading)
        placed_at = time.monotonic()
        stored = self._store(plan, bundle)
        made: list[tuple[str, str]] = []
        try:
            owner = plan.owner(stored.url, stored.sha256) if stored is not None else plan.owner()
            # Ctrl-C during a pod's create leaves no pod behind (PodCreates); a Job is created as any object
            created = self.creates.create(owner) if plan.kind == "Pod" else self.pods.create(owner)
            made.append((plan.kind, str(owner["metadata"]["name"])))
            for body in plan.owned(owner, created["metadata"]["uid"], runner):
                self.pods.create(body)
                made.append((str(body["kind"]), str(body["metadata"]["name"])))
        except BaseException:
            self._undo(made, plan.run_id if stored is not None else None)
            raise
        return Created(plan, created, b"" if stored is not None else bundle, placed_at)

    def _offload(self, offloading: Offloading) -> None:
        try:
            self.liqo.ensure_offloading(self.settings.namespace, list(offloading.clusters),
                                        create=self.settings.create_offloading,
                                        timeout=self.settings.offloading_timeout)
        except APIForbidden:
            if self.settings.create_offloading:
                raise
            # a hub user's server may not read it: the hub offloaded the namespace when the server started,
            # and if it did not, the pod's OffloadingBackOff is explained in words
        with self._lock:
            self._offloaded.update(offloading.marks)

    def _store(self, plan: LaunchPlan, bundle: bytes) -> Stored | None:
        if not plan.stored:
            return None
        assert self.storage is not None, "the planner stores a bundle only where object storage is configured"
        return self.storage.upload(plan.run_id, BUNDLE_OBJECT, bundle)

    def _undo(self, made: list[tuple[str, str]], stored_run: str | None) -> None:
        """Delete what a failed execution created, newest first (the owner's deletion alone would take the
        rest through garbage collection, later; a launch that failed leaves nothing at all)."""
        delete = {"Service": self.pods.delete_service, "Secret": self.pods.delete_secret,
                  "Job": lambda name: self.pods.delete_job(name, grace=0),
                  "Pod": lambda name: self.pods.delete_pod(name, grace=0)}
        for kind, name in reversed(made):
            # the launch's own failure is what the user needs; what a delete could not remove, the kernel's
            # label sweep removes at its next start
            with contextlib.suppress(APIError):
                delete[kind](name)
        if stored_run is not None and self.storage is not None:
            self.storage.remove_run(stored_run, keep=(LOG,))

    def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for pod creates Ctrl-C interrupted to be answered (and undone)."""
        self.creates.settle(timeout)
