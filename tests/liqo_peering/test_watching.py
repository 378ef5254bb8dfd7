"""The one watch request and list/watch loop, through the official client over real HTTP (the sandbox)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering.errors import APIGone, APIServerError
from gpu_offload.liqo_peering.retrying import Backoff
from gpu_offload.liqo_peering.watching import Collection, Event, ListResult, ListWatch, WatchStream
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.testing import RunningSandbox, running_sandbox


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSandbox]:
    with running_sandbox(tmp_path_factory.mktemp("watching")) as sb:
        yield sb


@pytest.fixture(scope="module")
def core(sandbox: RunningSandbox) -> Iterator[Any]:
    client = sandbox.api_client()
    yield kubernetes.client.CoreV1Api(client)
    client.close()


@pytest.fixture()
def ns(core: Any) -> Iterator[str]:
    name = f"w-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _cm(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"v": "0"}}


class Recorder:
    """A ``watching.Sink`` that keeps what the loop delivered."""

    def __init__(self) -> None:
        self.lists: list[ListResult] = []
        self.events: list[Event] = []
        self.errors: list[Exception] = []

    def listed(self, result: ListResult) -> None:
        self.lists.append(result)

    def event(self, event: Event) -> None:
        self.events.append(event)

    def failed(self, exc: Exception) -> None:
        self.errors.append(exc)

    def names(self) -> set[str]:
        """Object names known from the last list and the events after it."""
        names = {o["metadata"]["name"] for o in self.lists[-1].items} if self.lists else set()
        for event in self.events:
            if event["type"] in ("ADDED", "MODIFIED"):
                names.add(event["object"]["metadata"]["name"])
        return names


def configmaps(core: Any, ns: str) -> Collection:
    return Collection(f"ConfigMaps in {ns}", core.list_namespaced_config_map, {"namespace": ns})


def test_a_410_error_event_is_raised_as_gone(core: Any, ns: str, sandbox: RunningSandbox) -> None:
    old = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("x"))
    sandbox.api.store.compact()
    # The server answers an established watch with an ERROR event holding a Status (code 410); the stream
    # raises it typed, where kubernetes.watch.Watch(deserialize=False) fails on the event's missing raw_object.
    with pytest.raises(APIGone, match=r"watching ConfigMaps in w-\w+ failed \(HTTP 410: too old resource version"):
        list(configmaps(core, ns).watch(old, 5, WatchStream(f"ConfigMaps in {ns}")))


def test_events_come_as_dicts_and_a_stop_from_another_thread_ends_the_stream(core: Any, ns: str) -> None:
    listed = configmaps(core, ns).list()
    stream = WatchStream(f"ConfigMaps in {ns}")
    got: list[Event] = []

    def read() -> None:
        for event in configmaps(core, ns).watch(listed.resource_version, 60, stream):
            got.append(event)

    reader = threading.Thread(target=read)
    reader.start()
    core.create_namespaced_config_map(ns, _cm("a"))
    wait_until(lambda: got, "the ADDED event")
    started = time.monotonic()
    stream.stop()
    reader.join(10)
    assert not reader.is_alive() and time.monotonic() - started < 5  # not the 60 s server timeout
    assert [(e["type"], e["object"]["metadata"]["name"], e["object"]["data"]) for e in got] == [
        ("ADDED", "a", {"v": "0"})]


def test_the_loop_resumes_from_the_last_version_and_lists_again_after_410(core: Any, ns: str,
                                                                          sandbox: RunningSandbox) -> None:
    core.create_namespaced_config_map(ns, _cm("a"))
    sink = Recorder()
    loop = ListWatch(f"ConfigMaps in {ns}", configmaps(core, ns).list, configmaps(core, ns).watch, sink,
                     watch_seconds=1).start()
    try:
        wait_until(lambda: sink.lists, "the first list")
        core.create_namespaced_config_map(ns, _cm("b"))
        wait_until(lambda: "b" in sink.names(), "b through the watch")
        assert len(sink.lists) == 1  # a watch ending at its timeout resumes, it does not list again
        # Hold the next watch request, change the collection and forget the history meanwhile: the held
        # watch resumes from a resourceVersion the server no longer has, gets 410, and the loop lists again.
        rule = sandbox.api.faults.add(FaultRule(rf"^/api/v1/namespaces/{ns}/configmaps$", ("GET",), delay=30,
                                                times=1, hold=True))
        wait_until(lambda: sandbox.api.faults.fired(rule), "the next watch request held")
        core.create_namespaced_config_map(ns, _cm("c"))
        sandbox.api.store.compact()
        sandbox.api.faults.release(rule)
        wait_until(lambda: len(sink.lists) == 2, "a second list after 410 Gone")
        assert {o["metadata"]["name"] for o in sink.lists[1].items} == {"a", "b", "c"}
        assert sink.errors == []  # 410 is the protocol, not a failure
        core.create_namespaced_config_map(ns, _cm("d"))
        wait_until(lambda: "d" in sink.names(), "d through the watch after the relist")
    finally:
        loop.close()


def test_the_loop_backs_off_from_a_refusing_server_then_recovers(core: Any, ns: str, sandbox: RunningSandbox) -> None:
    # 500, not 503: the client's urllib3 would itself retry a 503 that carries Retry-After.
    rule = sandbox.api.faults.add(FaultRule(rf"^/api/v1/namespaces/{ns}/configmaps$", ("GET",), status=500))
    sink = Recorder()
    loop = ListWatch(f"ConfigMaps in {ns}", configmaps(core, ns).list, configmaps(core, ns).watch, sink,
                     backoff=Backoff(first=0.2, cap=0.4)).start()
    try:
        time.sleep(2.0)
        refused = sandbox.api.faults.fired(rule)
        # waits of 0.1-0.2 s, then 0.2-0.4 s: about 6 to 11 tries in 2 s; without a backoff, hundreds
        assert 3 <= refused <= 12, refused
        assert all(isinstance(e, APIServerError) for e in sink.errors) and len(sink.errors) == refused
        assert loop.failures == refused
    finally:
        sandbox.api.faults.remove(rule)
    try:
        core.create_namespaced_config_map(ns, _cm("after"))
        wait_until(lambda: sink.lists and "after" in sink.names(), "a list once the server answers")
        assert loop.failures == 0
    finally:
        loop.close()
