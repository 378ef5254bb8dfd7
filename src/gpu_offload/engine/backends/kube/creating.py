"""A runner pod's create that Ctrl-C does not cut off: the pod it may leave on the cluster is removed.

Ctrl-C (KeyboardInterrupt) while the create's request is in flight would close the connection, and the client
would never learn whether the API server created the pod: a server that had the whole request goes on and
creates it. A pod nobody follows would then wait in Kueue's queue, or hold its GPUs, with no Secret to start
from. So the request runs in a thread of its own; the interrupted caller marks it abandoned and the thread
deletes the pod once the create's answer says it exists. :meth:`PodCreates.settle` waits for such requests, so a
``gpu-offload run`` that exits on Ctrl-C leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from ....liqo_peering.errors import APIError
from .pods import PodApi


class _Create:
    """One create: its answer, and whether its caller still waits for it."""

    def __init__(self, pods: PodApi, body: Mapping[str, Any]) -> None:
        self.pods = pods
        self.body = body
        self.name = str(body["metadata"]["name"])
        self.created: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False
        self.answered = threading.Event()
        """Set once the create was answered (and, if abandoned, its pod deleted). Waited on instead of joining the
        thread: Python 3.11's ``Thread.join`` interrupted by Ctrl-C marks a thread that still runs as ended."""
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"gpu-offload-create-{self.name}")

    def _run(self) -> None:
        try:
            try:
                created = self.pods.create(self.body)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                self.error = exc
                return
            with self._lock:
                self.created = created
                abandoned = self._abandoned
            if abandoned:
                self._remove()
        finally:
            self.answered.set()

    def abandon(self) -> None:
        """The caller was interrupted: the pod goes as soon as (or, if already created, now that) it exists."""
        with self._lock:
            self._abandoned = True
            created = self.created is not None
        if created:
            self._remove()

    def _remove(self) -> None:
        with contextlib.suppress(APIError):  # unreachable now: the next start of this kernel cleans up
            self.pods.delete_pod(self.name, grace=0)


class PodCreates:
    """The runner pod creates of one kernel; those whose caller was interrupted are remembered until settled."""

    def __init__(self, pods: PodApi) -> None:
        self.pods = pods
        self._abandoned: list[_Create] = []
        self._lock = threading.Lock()

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create the pod, as :meth:`PodApi.create`; on KeyboardInterrupt the pod is removed whatever the
        server does with the request, and the interrupt goes on."""
        call = _Create(self.pods, body)
        call.thread.start()
        try:
            call.answered.wait()
        except BaseException:
            call.abandon()
            with self._lock:
                self._abandoned.append(call)
            raise
        if call.error is not None:
            raise call.error
        assert call.created is not None
        return call.created

    def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for interrupted creates to be answered (and their pods removed)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            calls, self._abandoned = self._abandoned, []
        for call in calls:
            call.answered.wait(max(0.0, deadline - time.monotonic()))
