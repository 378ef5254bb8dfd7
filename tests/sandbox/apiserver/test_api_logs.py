"""``pods/log`` through the official client: follow while the kubelet writes, timestamps, sinceTime,
tailLines, and the errors a client gets for pods that have not started or have several containers."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
import urllib3
from kubernetes import watch
from kubernetes.client import ApiException


def _log(core, ns, **params) -> str:
    # client 36 turns a plain-text body into "b'...'" when it deserializes; read the body raw instead
    return core.read_namespaced_pod_log("p", ns, _preload_content=False, **params).data.decode()


@pytest.fixture()
def running(core, ns, pod, api_sandbox):
    core.create_namespaced_pod(ns, pod("p"))
    core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Running"}})
    return api_sandbox.api.logs, ns


def test_log_follow_streams_lines_as_they_are_written(core, running):
    logs, ns = running
    logs.write(ns, "p", "main", "first\n")
    got = []
    for line in watch.Watch().stream(core.read_namespaced_pod_log, name="p", namespace=ns, follow=True):
        got.append(line)
        if line == "first":  # the stream is open: the process keeps writing, in pieces
            logs.write(ns, "p", "main", "sec")
            logs.write(ns, "p", "main", "ond\nthird\n")
        if line == "third":
            logs.close(ns, "p", "main")  # the container ends: the follow stream ends
    assert got == ["first", "second", "third"]


def test_log_without_follow_returns_what_is_there(core, running):
    logs, ns = running
    logs.write(ns, "p", "main", "a\nb\nc\n")
    assert _log(core, ns) == "a\nb\nc\n"
    assert _log(core, ns, tail_lines=2) == "b\nc\n"
    assert _log(core, ns, limit_bytes=4) == "a\nb\n"


def test_timestamps_and_since_time(core, running):
    logs, ns = running
    t0 = datetime(2026, 11, 22, 1, 0, 0, tzinfo=timezone.utc)
    logs.write(ns, "p", "main", "old\n", when=t0)
    logs.write(ns, "p", "main", "new\n", when=t0 + timedelta(minutes=5))
    stamped = _log(core, ns, timestamps=True).splitlines()
    assert stamped[0] == "2026-11-22T01:00:00.000000000Z old"
    # sinceTime is not a parameter of the generated client: ask over its raw call
    resp = core.api_client.call_api(
        f"/api/v1/namespaces/{ns}/pods/p/log", "GET", query_params=[("sinceTime", "2026-11-22T01:02:00Z")],
        _preload_content=False)
    assert resp.data == b"new\n"


def test_follow_of_a_cut_stream_breaks_like_a_dropped_connection(core, running):
    logs, ns = running
    logs.write(ns, "p", "main", "one\n")
    resp = core.read_namespaced_pod_log("p", ns, follow=True, _preload_content=False)
    chunks = resp.stream(decode_content=True)
    assert next(chunks) == b"one\n"
    threading.Timer(0.2, logs.cut, (ns, "p")).start()
    with pytest.raises(urllib3.exceptions.HTTPError):
        for _ in chunks:
            pass
    # a reconnecting reader resumes: the log itself is intact
    logs.write(ns, "p", "main", "two\n")
    assert _log(core, ns) == "one\ntwo\n"


def test_pending_pod_log_is_400_waiting_to_start(core, ns, pod):
    core.create_namespaced_pod(ns, pod("p"))
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("p", ns)
    assert err.value.status == 400
    assert "is waiting to start: ContainerCreating" in json.loads(err.value.body)["message"]


def test_two_containers_need_a_container_name(core, ns, pod, api_sandbox):
    body = pod("p")
    body["spec"]["containers"].append({"name": "side", "image": "x"})
    core.create_namespaced_pod(ns, body)
    api_sandbox.api.logs.write(ns, "p", "side", "from side\n")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("p", ns)
    assert "choose one of: [main side]" in json.loads(err.value.body)["message"]
    assert _log(core, ns, container="side") == "from side\n"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("p", ns, container="nope")
    assert err.value.status == 400


def test_deleting_the_pod_drops_its_logs(core, running):
    logs, ns = running
    logs.write(ns, "p", "main", "x\n")
    core.delete_namespaced_pod("p", ns)
    assert not logs.has(ns, "p", "main")
