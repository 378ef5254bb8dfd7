"""Reads a runner pod: its phase through a watch until the runner starts, then its frames through a log follow.

A dropped log stream is resumed with ``sinceTime`` set to the second of the last line received; the lines
of that second come again and the frame decoder drops the frames it has seen (``seq <= last_seen``), so
nothing is lost or repeated. A stream that could not be opened or gave nothing is resumed after the
project's backoff (``liqo_peering.retrying``), so a refusing endpoint is not asked again in a busy loop. A one-shot follower stops after the ``done`` frame: the success path costs
one watch and one log request.

A one-shot pod reads its bundle on stdin (``stdin`` here): the follower writes it through one attach as soon as
the runner container runs, so the cell's code, inputs and nonce reach that pod only, never a Secret that Liqo
would copy to every donor of the namespace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ....liqo_peering import labels as L
from ....liqo_peering.errors import APIError, APIGone
from ....liqo_peering.retrying import WATCH_BACKOFF
from ....liqo_peering.watching import QUICK_END, WATCH_SECONDS, release_stream
from ....runner.frames import MAX_LINE_BYTES, Done, Event, FrameDecoder, Hello, Noise, Status
from ....runner.lines import LineSplitter, Overlong
from ...timing import Phase
from ..base import Placed
from .explain import (
    FAILED,
    FINISHED,
    RUNNING,
    WAITING,
    PodContext,
    PodState,
    placed_text,
    pod_state,
    queued,
    ran_for,
    stopped_by_kueue,
)
from .pods import PodApi
from .pulling import PULL_CHECK_SECONDS, PullWatch, may_pull

DIAGNOSTIC_LINES = 30
CHUNK = 1 << 16
STAMP_BYTES = 40
"""Room for the RFC 3339 timestamp the API puts before each log line."""


KUEUE_PICKS = "the cluster Kueue picks"
"""A queued pod's cluster until Kueue admits it (never a trusted cluster id)."""


def admitted_context(pod: Mapping[str, Any], ctx: PodContext) -> PodContext:
    """``ctx`` of a queued pod once Kueue admitted it: the cluster (and model) of the flavor Kueue chose, which
    it wrote into the pod's node selector. A pod pinned to a cluster (``--cluster``) learns the model there."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    cluster = selector.get(L.REMOTE_CLUSTER_ID_LABEL)
    if not cluster or (ctx.cluster != KUEUE_PICKS and (ctx.model or cluster != ctx.cluster)):
        return ctx
    # the share and its isolation are the admitted donor's (Kueue may pick among donors that isolate differently)
    return dataclasses.replace(ctx, cluster=str(cluster), model=selector.get(L.GPU_MODEL) or ctx.model).on_cluster()


FINAL_READS = 4
"""Reads of a finished container's log at most, before what arrived is taken as all it wrote (``_read_to_end``)."""


@dataclass(frozen=True)
class PodEnded:
    """The follower's last item: how the pod ended (or that following it failed)."""

    state: PodState


def since_second(stamp: bytes) -> str:
    """``2026-11-22T01:02:03.123456789Z`` -> ``2026-11-22T01:02:03Z`` (the API's sinceTime precision)."""
    text = stamp.decode("ascii", "replace")
    return text.split(".")[0].rstrip("Z") + "Z"


class PodFollower:
    """A daemon thread turning one pod into a queue of frames, ``Status`` progress and a final ``PodEnded``."""

    def __init__(self, pods: PodApi, pod: Mapping[str, Any], nonce: str, ctx: PodContext, *,
                 one_shot: bool = True, watch_seconds: int = 30, run_id: str | None = None,
                 ranks: int = 1, stdin: bytes | None = None,
                 on_end: Callable[[PodFollower], None] | None = None) -> None:
        """``ranks``: the world size of a distributed run, whose pods' frames carry their ranks; ``stdin``: the
        bundle, written to the runner's stdin once it runs (None: it reads no bundle there); ``on_end``: called
        from the follower's thread once the pod ended (not when the follower was stopped)."""
        self.pods = pods
        self.name = str(pod["metadata"]["name"])
        self.uid = str(pod["metadata"].get("uid") or "")
        self.started_at: str | None = None
        self._scheduled = False
        """When the runner container started, as its status said (to tell how long a stopped run ran)."""
        self.ctx = ctx
        self.one_shot = one_shot
        self.watch_seconds = watch_seconds
        self.events: queue.Queue[Event | Placed | Phase | PodEnded] = queue.Queue()
        self.diagnostics: deque[str] = deque(maxlen=DIAGNOSTIC_LINES)
        self.started = threading.Event()
        """Set once the pod stopped waiting: its runner container runs, or it ended without running (then the
        ``PodEnded`` follows at once)."""
        self.running = threading.Event()
        """Set once the runner container runs: only then may a session attach to its stdin."""
        self.resumes = 0
        self.lines = 0
        """Log lines received so far (those a resume repeats included)."""
        self.placed = ""
        """Where the pod runs (``placed_text``), once it was bound and its runner started."""
        self.end: PodState | None = None
        """How the pod ended, once the follower saw it (a session's next cell says why its state is gone)."""
        self.node = ""
        """The node the pod was bound to, once seen (a session on a cordoned node moves before its next cell)."""
        self.gated = queued(pod)
        """The pod still waits for Kueue to admit it (its admission gate is on), as last seen."""
        self._decoder = FrameDecoder(nonce, run_id=run_id, ranks=ranks)
        self._decoding = threading.Lock()  # a session's next run may change what the decoder expects
        self._stop = threading.Event()
        self._stream: Any = None
        self._response: Any = None
        self._last_stamp: bytes | None = None
        self._done_seen = False
        self._stdin = stdin
        self._on_end = on_end
        self._thread = threading.Thread(target=self._run, args=(dict(pod),), daemon=True,
                                        name=f"gpu-offload-follow-{self.name}")
        self._thread.start()

    def next(self, timeout: float) -> Event | Placed | Phase | PodEnded | None:
        """The next item within ``timeout`` seconds, else None."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        """Stop following (no further request is made); the thread ends soon after."""
        self._stop.set()
        if self._stream is not None:
            self._stream.stop()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed
                response.shutdown()  # unblocks a read waiting for the next log line

    def expect_run(self, run_id: str) -> int:
        """Give from now on only frames of ``run_id`` (a session's next run); returns how many items of
        earlier runs, decoded but not yet taken, were dropped. See :attr:`foreign` for later ones."""
        with self._decoding:
            self._decoder.expect_run(run_id)
            kept: list[Event | Placed | Phase | PodEnded] = []
            dropped = 0
            while True:
                try:
                    item = self.events.get_nowait()
                except queue.Empty:
                    break
                # only frames of an earlier run are stale: where the pod landed and when its phases ended are
                # the pod's, and the first run of a session still has to show them
                if isinstance(item, Hello | PodEnded | Status | Placed | Phase):
                    kept.append(item)
                else:
                    dropped += 1
            for item in kept:
                self.events.put(item)
        return dropped

    @property
    def foreign(self) -> int:
        """Frames dropped because they belonged to another run."""
        return self._decoder.foreign

    @property
    def ended(self) -> bool:
        """The pod ended (or following it failed): the follower has nothing more to give."""
        return not self._thread.is_alive()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end."""
        self._thread.join(timeout)

    # --- the thread ---

    def _run(self, pod: dict[str, Any]) -> None:
        state: PodState | None
        try:
            state = self._until_started(pod)
            if state.kind == RUNNING and self._stdin is not None:
                state = self._hand_bundle() or state
            if state.kind in (RUNNING, FINISHED):
                self.running.set()
                self.started.set()
                state = self._follow_logs()
        except Exception as exc:  # noqa: BLE001 - a silent thread would leave the cell waiting forever
            state = PodState(FAILED, f"following pod {self.name} failed: {exc}", "FollowError")
        # the end goes into the queue before ``started`` is set, so whoever sees ``started`` without ``running``
        # finds the reason waiting instead of attaching to a pod that never ran
        if state is not None and not self._stop.is_set():
            self.end = state
            self.events.put(PodEnded(state))
        self.started.set()
        if state is not None and not self._stop.is_set() and self._on_end is not None:
            self._on_end(self)

    def _seen(self, pod: Mapping[str, Any]) -> PodState:
        self.gated = queued(pod)
        if not self.gated:
            self.ctx = admitted_context(pod, self.ctx)
        if not self._scheduled and (pod.get("spec") or {}).get("nodeName"):
            self._scheduled = True
            self.node = str(pod["spec"]["nodeName"])
            self.events.put(Phase("schedule", time.monotonic()))
        return pod_state(pod, self.ctx)

    def _until_started(self, pod: dict[str, Any]) -> PodState:
        state = self._seen(pod)
        version = str(pod["metadata"].get("resourceVersion") or "")
        shown = ""
        pulls = PullWatch(self.pods, self.name, self.uid)
        while state.kind == WAITING and not self._stop.is_set():
            said, shown = state.text, self._waiting(state, pod, pulls, shown)
            # a pod in Kueue's line may wait long and changes only when admitted: one long watch, not one per
            # watch_seconds; a bound pod waiting for its container may be pulling, which changes no pod field
            seconds = max(self.watch_seconds, WATCH_SECONDS) if self.gated else self.watch_seconds
            if may_pull(pod):
                seconds = min(seconds, PULL_CHECK_SECONDS)
            self._stream, events = self.pods.watch_pod(self.name, version, seconds)
            try:
                for event in events:
                    if event.get("type") == "DELETED":
                        return self.gone()
                    if event.get("type") not in ("ADDED", "MODIFIED"):
                        continue
                    pod = event["object"]
                    version = str(pod["metadata"].get("resourceVersion") or version)
                    state = self._seen(pod)
                    if state.kind != WAITING:
                        self._stream.stop()
                        break
                    if state.text != said:  # a new state: said at once (its pull asked again)
                        said, shown = state.text, self._waiting(state, pod, pulls, shown)
            except APIGone:  # the pod's resourceVersion is too old to watch from: read it again
                fresh = self.pods.read_pod(self.name)
                if fresh is None:
                    return self.gone()
                pod = fresh
                version = str(pod["metadata"].get("resourceVersion") or version)
                state = self._seen(pod)
        if state.kind in (RUNNING, FINISHED):
            runner = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state") or {}
            self.started_at = (runner.get("running") or runner.get("terminated") or {}).get("startedAt")
            # said once per pod, before the cell's first output: the user sees where the cell went
            self.placed = placed_text(pod, self.ctx)
            self.events.put(Phase("container start", time.monotonic()))
            self.events.put(Placed(self.placed, self.ctx.cluster))
        return state

    def _waiting(self, state: PodState, pod: Mapping[str, Any], pulls: PullWatch, shown: str) -> str:
        """Say a waiting state once it changed, with its image pull when one is under way; what is shown now."""
        pulling = pulls.words(pod)
        text = f"{state.text}; {pulling}" if pulling else state.text
        if text != shown:
            self.events.put(Status(-1, text))
        return text

    def _hand_bundle(self) -> PodState | None:
        """Write the bundle to the runner's stdin through one attach, whose end closes it (``stdinOnce``);
        a failed attach ends the run (the runner would wait for its bundle until deleted)."""
        payload, self._stdin = self._stdin, None
        try:
            ws = self.pods.attach(self.name)
            try:
                ws.write_stdin(payload)
            finally:
                ws.close()
        except Exception as exc:  # noqa: BLE001 - any failure means the runner never gets its bundle
            return PodState(FAILED, f"could not send the cell to pod {self.name} (attach to its stdin): {exc}",
                            "AttachFailed")
        return None

    def _follow_logs(self) -> PodState | None:
        """Follow the log until the ``done`` frame (one-shot) or the container's end; resume after drops,
        waiting the backoff first when the last stream was refused or ended at once without a line."""
        idle = 0
        version = ""
        while not self._stop.is_set():
            state = self._wait_watching(WATCH_BACKOFF.delay(idle), version) if idle and version else None
            if self._stop.is_set():
                return None
            if state is None:
                lines, opened = self.lines, time.monotonic()
                self._read_stream()
                # refused, or ended at once with nothing: the next try waits; a stream that lasted does not
                lasted = self.lines > lines or time.monotonic() - opened >= QUICK_END
                idle = 0 if lasted else idle + 1
                if self._stop.is_set() or (self.one_shot and self._done_seen):
                    return None
                pod = self.pods.read_pod(self.name)
                if pod is None:
                    return self.gone()
                version = str(pod["metadata"].get("resourceVersion") or "")
                state = pod_state(pod, self.ctx)
            if state.kind in (FINISHED, FAILED):
                self._read_to_end(state.kind == FINISHED)  # what the container wrote between the drop and its end
                for event in self._decoder.close():
                    self._deliver(event)
                return state
            self.resumes += 1
        return None

    def _wait_watching(self, seconds: float, version: str) -> PodState | None:
        """Wait ``seconds`` before the refused log is asked again, watching the pod meanwhile: a runner whose log
        cannot be read may be on a node that stopped answering, and the pod's end (Kubernetes evicting it from
        that node) ends the wait at once instead of after a backoff that has grown to half a minute."""
        deadline = time.monotonic() + seconds
        try:
            self._stream, events = self.pods.watch_pod(self.name, version, max(1, math.ceil(seconds)))
            for event in events:
                if event.get("type") == "DELETED":
                    return self.gone()
                if event.get("type") in ("ADDED", "MODIFIED"):
                    state = pod_state(event["object"], self.ctx)
                    if state.kind in (FINISHED, FAILED):
                        self._stream.stop()
                        return state
                if self._stop.is_set() or time.monotonic() >= deadline:
                    break
        except APIError:  # the watch failed too: the wait is the backoff alone
            pass
        self._stop.wait(max(0.0, deadline - time.monotonic()))
        return None

    def gone(self) -> PodState:
        """Why the pod is gone: in Kueue's words when Kueue stopped it (it leaves a ``Stopped`` event on the
        pod), else deleted by someone."""
        try:
            event = self.pods.stop_event(self.name, self.uid)
        except APIError:  # events not readable: say what is certain
            event = None
        if event is None:
            return _deleted(self.name)
        stopped = str(event.get("lastTimestamp") or event.get("eventTime") or "")
        return stopped_by_kueue("", str(event.get("message") or ""), ran_for(self.started_at, stopped), self.ctx)

    def _read_to_end(self, finished: bool) -> None:
        """Read the log of a container that ended. A finished one-shot runner wrote its done frame last: a read
        refused or dropped under load would lose it and report a cell that completed as "exit code 0", so a
        finished container's log is read again (after the backoff) until a read ends as the server ends it,
        the done frame arrived, or ``FINAL_READS`` reads were made."""
        reads = FINAL_READS if finished else 1
        for attempt in range(1, reads + 1):
            if self._read_stream() or (self.one_shot and self._done_seen) or self._stop.is_set():
                return
            if attempt < reads and self._stop.wait(WATCH_BACKOFF.delay(attempt)):
                return

    def _read_stream(self) -> bool:
        """Read one log stream from the last line's second; True when the server ended it (everything written so
        far was read), False when it was refused or dropped."""
        since = since_second(self._last_stamp) if self._last_stamp else None
        try:
            self._response = self.pods.open_log(self.name, since)
        except Exception as exc:  # noqa: BLE001 - the caller reads the pod to learn why
            self.diagnostics.append(f"log stream of pod {self.name} not opened: {exc}")
            return False
        lines = LineSplitter(STAMP_BYTES + MAX_LINE_BYTES)
        read_to_end = False
        try:
            for chunk in self._response.stream(CHUNK, decode_content=False):
                for line in lines.feed(chunk):
                    self._line(line)
                if self.one_shot and self._done_seen:
                    break
            else:
                read_to_end = True
        except Exception:  # noqa: BLE001 - a dropped stream ends the same way as a finished one: resume
            return False
        finally:
            response, self._response = self._response, None
            if response is not None:
                release_stream(response, read_to_end)
        return True

    def _line(self, line: bytes | Overlong) -> None:
        self.lines += 1
        if isinstance(line, Overlong):  # no frame is that long: keep its start for diagnostics
            stamp, _, head = line.head.partition(b" ")
            self._last_stamp = stamp
            self.diagnostics.append(f"log line of {line.size} bytes dropped: {head[:80]!r}")
            return
        stamp, _, text = line.partition(b" ")
        self._last_stamp = stamp
        with self._decoding:
            for event in self._decoder.feed(text + b"\n"):
                self._deliver(event)

    def _deliver(self, event: Event) -> None:
        if isinstance(event, Noise):
            self.diagnostics.append(event.line)
            return
        if isinstance(event, Done):
            self._done_seen = True
        self.events.put(event)


def _deleted(name: str) -> PodState:
    return PodState(FAILED, f"pod {name} was deleted while the cell ran (by `%gpu_offload cleanup`, another "
                            "kernel's cleanup or an admin); run the cell again", "PodDeleted")
