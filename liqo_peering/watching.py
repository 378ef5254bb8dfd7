"""List, then watch: the one watch request of the project and the one loop that keeps a collection current.

``WatchStream`` is one watch request through the official client. It reads the newline-delimited events
itself, each parsed once into a plain dict, and raises an ERROR event as the typed error of its status
(``APIGone`` for 410), which ``kubernetes.watch.Watch`` with ``deserialize=False`` cannot do (it fails on
the event's missing ``raw_object``). Another thread may ``stop()`` it.

``ListWatch`` runs the loop of client-go's reflector in a daemon thread: list, watch from the list's
resourceVersion, resume from the last event or bookmark after each server timeout, list again only on 410
Gone, and after any other failure wait a jittered exponential backoff with a cap (``retrying.Backoff``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from .errors import APIGone, api_error, status_error
from .retrying import WATCH_BACKOFF, Backoff
from .untrusted_text import shown

Event = dict[str, Any]
WATCH_SECONDS = 240
"""Server-side watch timeout: how long one watch request stays open before the loop resumes with a new one."""
READ_MARGIN = 30
"""Seconds the client's read timeout adds to the server's: it only catches a connection that went silent."""
QUICK_END = 1.0
"""A watch that ends cleanly this soon with no event counts as a failure: a server closing every watch at
once must meet the backoff, not a busy loop."""


@dataclass(frozen=True)
class ListResult:
    """A list response: the items and the resourceVersion to watch from."""

    items: tuple[dict[str, Any], ...]
    resource_version: str


def event_version(event: Mapping[str, Any]) -> str | None:
    """The resourceVersion an event moves a watch to (bookmarks included), None when it names none."""
    version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


def event_error(event: Mapping[str, Any], what: str) -> Exception:
    """The typed error of an ERROR event (its object is a ``Status``)."""
    status = event.get("object") or {}
    # The Status is the server's words, and the server may be a donor's or one Liqo reflects: its message can
    # hold terminal escapes, a newline forging a line of ours, or a megabyte, and it ends up in the notebook.
    detail = shown(status.get("message") or status.get("reason") or status)
    return status_error(int(status.get("code") or 0) or 500, "watching", what, detail)


class WatchStream:
    """One watch request; ``stop()`` from another thread ends it (no further event is yielded)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._stopped = threading.Event()
        self._response: Any = None

    @property
    def stopped(self) -> bool:
        """``stop()`` was called."""
        return self._stopped.is_set()

    def stop(self) -> None:
        """End the request: unblocks a read waiting for the next event."""
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed
                response.shutdown()

    def events(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Event]:
        """Raw events (``type``, ``object`` as a dict) of one ``func(*args, watch=True, **kwargs)`` request.

        ERROR events and failed requests are raised as ``errors.APIError`` subclasses.
        """
        if self.stopped:
            return
        try:
            response = func(*args, watch=True, _preload_content=False, **kwargs)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "watching", self.what) from exc
        self._response = response
        read_to_end = False
        try:
            for line in iter_resp_lines(response):
                if self.stopped:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    raise event_error(event, self.what)
                yield event
            read_to_end = True
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self.stopped:
                return  # our own stop() shut the socket
            raise api_error(exc, "watching", self.what) from exc
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                release_stream(response, read_to_end)


def release_stream(response: Any, read_to_end: bool) -> None:
    """Give a streamed response's connection back to the pool, closing it first unless its body was read to the
    end: a half-read body left on a pooled connection is read by the next request on it as its answer (a
    ``BadStatusLine`` with the rest of the stream), and urllib3 then retries that request, so a DELETE answers
    404 and a POST could be sent twice."""
    if not read_to_end:
        response.close()
    response.release_conn()


@dataclass(frozen=True)
class Collection:
    """A list call of the official client with its fixed arguments (group, version, plural, selectors)."""

    what: str
    """Named in errors, e.g. ``Pods (cluster-wide)``."""
    func: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def list(self, request_timeout: float | None = None) -> ListResult:
        """One list request: the items as the server sent them, and the resourceVersion to watch from."""
        try:
            response = self.func(**self.kwargs, _preload_content=False, _request_timeout=request_timeout)
            body = json.loads(response.data)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "listing", self.what) from exc
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return ListResult(tuple(body.get("items") or ()), version)

    def watch(self, resource_version: str, timeout_seconds: int, stream: WatchStream) -> Iterator[Event]:
        """Events from ``resource_version`` for one server timeout, bookmarks included."""
        return stream.events(
            self.func, **self.kwargs, resource_version=resource_version, timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True, _request_timeout=timeout_seconds + READ_MARGIN,
        )


class Sink(Protocol):
    """Where a ``ListWatch`` delivers what it learns; called from its thread."""

    def listed(self, result: ListResult) -> None:
        """A fresh list: replace everything held."""

    def event(self, event: Event) -> None:
        """One watch event (ADDED, MODIFIED, DELETED or BOOKMARK)."""

    def failed(self, exc: Exception) -> None:
        """A list or watch failed; the loop waits, then tries again."""


class ListWatch:
    """Keeps one collection current from a daemon thread (see the module docstring)."""

    def __init__(self, what: str, lister: Callable[[], ListResult],
                 watcher: Callable[[str, int, WatchStream], Iterator[Event]], sink: Sink,
                 watch_seconds: int = WATCH_SECONDS, backoff: Backoff = WATCH_BACKOFF) -> None:
        self.what = what
        self._list = lister
        self._watch = watcher
        self._sink = sink
        self._watch_seconds = watch_seconds
        self._backoff = backoff
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self.resource_version: str | None = None
        self.failures = 0
        """Failures in a row (0 once a list or watch went well)."""
        self._just_listed = False
        self._thread = threading.Thread(target=self._run, name=f"gpu-offload-watch-{what}", daemon=True)

    def start(self) -> ListWatch:
        """Start the thread (a daemon: a process exiting never waits for a watch)."""
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching and wait briefly for the thread."""
        self._stop.set()
        if self._stream is not None:
            self._stream.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._once()
            except APIGone as exc:
                # too old: list again, at once unless the version of a list just made was already too old
                if self.resource_version is None or self._just_listed:
                    self._failed(exc)
                self.resource_version = None
            except Exception as exc:  # noqa: BLE001 - a watch thread that dies leaves its readers silently stale
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self._sink.failed(exc)
        self._stop.wait(self._backoff.delay(self.failures))

    def _once(self) -> None:
        if self.resource_version is None:
            result = self._list()
            self.resource_version = result.resource_version
            self._just_listed, self.failures = True, 0
            self._sink.listed(result)
        stream = self._stream = WatchStream(self.what)
        if self._stop.is_set():
            return
        started, seen = time.monotonic(), 0
        for event in self._watch(self.resource_version, self._watch_seconds, stream):
            if self._stop.is_set():
                stream.stop()
                return
            self._sink.event(event)
            self.resource_version = event_version(event) or self.resource_version
            seen += 1
            self._just_listed, self.failures = False, 0
        if not seen and time.monotonic() - started < QUICK_END and not self._stop.is_set():
            raise api_error(Exception("the server ended the watch at once, without an event"), "watching", self.what)
        self._just_listed, self.failures = False, 0
